//! The `groups.*` settings (`FELIX_GROUP_*`): consumer-group limits (docs/groups.md).

use std::time::Duration;

use felix_engine::GroupConfig;

use super::ConfigError;

/// Reads the `groups.*` settings into `groups`; every value must be above zero.
pub(super) fn groups_from_settings(
    int: &impl Fn(&str) -> Option<u64>,
    name: &impl Fn(&str) -> String,
    groups: &mut GroupConfig,
) -> Result<(), ConfigError> {
    let positive = |key: &str| super::positive(int, name, key);
    if let Some(n) = positive("groups.max_attempts")? {
        groups.max_attempts = u32::try_from(n).map_err(|_| {
            ConfigError(format!(
                "{}={n} is out of range",
                name("groups.max_attempts")
            ))
        })?;
    }
    if let Some(ms) = positive("groups.visibility_timeout_ms")? {
        groups.visibility_timeout = Duration::from_millis(ms);
    }
    if let Some(ms) = positive("groups.max_visibility_ms")? {
        groups.max_visibility = Duration::from_millis(ms);
    }
    if let Some(ms) = positive("groups.max_wait_ms")? {
        groups.max_wait = Duration::from_millis(ms);
    }
    if let Some(n) = positive("groups.max_in_flight")? {
        groups.max_in_flight = n as usize;
    }
    if let Some(n) = positive("groups.max_waiting_polls")? {
        groups.max_waiting_polls = n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(values: &[(&str, u64)]) -> Result<GroupConfig, ConfigError> {
        let int = |key: &str| values.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        let name = |key: &str| key.to_owned();
        let mut g = GroupConfig::default();
        groups_from_settings(&int, &name, &mut g)?;
        Ok(g)
    }

    #[test]
    fn group_settings_set_the_limits_and_zero_is_refused() {
        assert_eq!(read(&[]).unwrap(), GroupConfig::default());
        let g = read(&[
            ("groups.max_attempts", 3),
            ("groups.visibility_timeout_ms", 1500),
            ("groups.max_wait_ms", 2000),
            ("groups.max_in_flight", 64),
            ("groups.max_waiting_polls", 7),
        ])
        .unwrap();
        assert_eq!(g.max_attempts, 3);
        assert_eq!(g.visibility_timeout, Duration::from_millis(1500));
        assert_eq!(g.max_wait, Duration::from_secs(2));
        assert_eq!(g.max_in_flight, 64);
        assert_eq!(g.max_waiting_polls, 7);
        let e = read(&[("groups.max_attempts", 0)]).unwrap_err();
        assert!(e.0.contains("groups.max_attempts"), "{e}");
    }

    /// The defaults `--print-config` shows are the engine's.
    #[test]
    fn printed_group_defaults_are_the_engine_defaults() {
        let d = GroupConfig::default();
        let shown = |key: &str| {
            super::super::SETTINGS
                .iter()
                .find(|s| s.key == key)
                .map(|s| match s.default {
                    super::super::Default_::Int(n) => Some(n),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("{key} is declared"))
        };
        assert_eq!(shown("groups.max_attempts"), Some(d.max_attempts as u64));
        assert_eq!(
            shown("groups.visibility_timeout_ms"),
            Some(d.visibility_timeout.as_millis() as u64)
        );
        assert_eq!(
            shown("groups.max_visibility_ms"),
            Some(d.max_visibility.as_millis() as u64)
        );
        assert_eq!(
            shown("groups.max_wait_ms"),
            Some(d.max_wait.as_millis() as u64)
        );
        assert_eq!(shown("groups.max_in_flight"), Some(d.max_in_flight as u64));
        assert_eq!(
            shown("groups.max_waiting_polls"),
            Some(d.max_waiting_polls as u64)
        );
    }
}
