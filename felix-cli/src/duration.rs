//! Durations on the command line: a decimal number and a unit (`1.5s`, `250ms`, `10m`, `1h`,
//! `2d`); a bare number is seconds.

use std::time::Duration;

/// Parses `1.5s`-style durations (for clap's `value_parser`).
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit_secs = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "m" | "min" | "mins" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => return Err(format!("unknown unit {other:?} (use ms, s, m, h or d)")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 1.5s, 250ms or 1h"))?;
    Duration::try_from_secs_f64(value * unit_secs).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_fractions() {
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86_400)));
    }

    #[test]
    fn nonsense_is_refused() {
        assert!(parse("").is_err());
        assert!(parse("s").is_err());
        assert!(parse("1.2.3s").is_err());
        assert!(parse("5 parsecs").is_err());
        assert!(parse("-1s").is_err());
    }
}
