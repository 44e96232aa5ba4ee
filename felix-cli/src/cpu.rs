//! CPU time for `felix bench`: this process's own (`/proc/self/stat`), and the broker's, read
//! as `process_cpu_seconds_total` from its `/metrics` endpoint (`--metrics`).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::failure::Failure;

/// How long one scrape may take, connecting and reading together.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes read from one scrape (the broker's whole exposition is a few KiB).
const MAX_SCRAPE_BYTES: u64 = 4 << 20;

/// This process's user + system CPU seconds, every thread included; `None` off Linux.
pub(crate) fn own_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name, in parentheses, may hold spaces; the fields after it are fixed:
    // utime and stime are the 12th and 13th after it, in ticks of 1/100 s (Linux's USER_HZ).
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// Where `--metrics` points: `http://HOST:PORT[/PATH]` (path `/metrics` when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetricsUrl {
    host_port: String,
    path: String,
}

impl MetricsUrl {
    pub(crate) fn parse(url: &str) -> Result<MetricsUrl, Failure> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            Failure::usage(format!("--metrics {url:?}: expected http://HOST:PORT"))
        })?;
        let (host_port, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/metrics"),
        };
        if host_port.is_empty() || !host_port.contains(':') {
            return Err(Failure::usage(format!(
                "--metrics {url:?}: expected http://HOST:PORT"
            )));
        }
        Ok(MetricsUrl {
            host_port: host_port.to_owned(),
            path: path.to_owned(),
        })
    }

    /// The broker's `process_cpu_seconds_total` now.
    pub(crate) fn broker_cpu_seconds(&self) -> Result<f64, Failure> {
        let body = self.get()?;
        parse_cpu(&body).ok_or_else(|| {
            Failure::Connection(format!(
                "http://{}{}: no process_cpu_seconds_total in the answer",
                self.host_port, self.path
            ))
        })
    }

    /// One HTTP/1.0 GET; the answer's body.
    fn get(&self) -> Result<String, Failure> {
        let fail = |e: std::io::Error| {
            Failure::Connection(format!("http://{}{}: {e}", self.host_port, self.path))
        };
        let addr = self
            .host_port
            .to_socket_addrs()
            .map_err(fail)?
            .next()
            .ok_or_else(|| fail(std::io::Error::other("no address")))?;
        let mut conn = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT).map_err(fail)?;
        conn.set_read_timeout(Some(SCRAPE_TIMEOUT)).map_err(fail)?;
        conn.set_write_timeout(Some(SCRAPE_TIMEOUT)).map_err(fail)?;
        write!(
            conn,
            "GET {} HTTP/1.0\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.path, self.host_port
        )
        .map_err(fail)?;
        let mut raw = String::new();
        conn.take(MAX_SCRAPE_BYTES)
            .read_to_string(&mut raw)
            .map_err(fail)?;
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head.lines().next().unwrap_or("");
        if status.split_whitespace().nth(1) != Some("200") {
            return Err(fail(std::io::Error::other(format!("answered {status:?}"))));
        }
        Ok(body.to_owned())
    }
}

/// The value of `process_cpu_seconds_total` in a Prometheus text exposition.
fn parse_cpu(body: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        let v = l.strip_prefix("process_cpu_seconds_total")?;
        // A bare name, or one with labels; the value is the next field.
        let v = v
            .strip_prefix(' ')
            .or_else(|| Some(v.split_once("} ")?.1))?;
        v.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_need_a_host_and_port_and_default_to_slash_metrics() {
        let u = MetricsUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (u.host_port.as_str(), u.path.as_str()),
            ("127.0.0.1:8080", "/metrics")
        );
        let u = MetricsUrl::parse("http://localhost:9/m").unwrap();
        assert_eq!(u.path, "/m");
        for bad in [
            "127.0.0.1:8080",
            "https://h:1",
            "http://",
            "http://host/metrics",
        ] {
            assert!(MetricsUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_cpu_counter_is_found_among_other_metrics() {
        let body = "# TYPE process_cpu_seconds counter\n\
                    process_cpu_seconds_total 12.5\n\
                    felix_broker_deliveries_total 3\n# EOF\n";
        assert_eq!(parse_cpu(body), Some(12.5));
        assert_eq!(
            parse_cpu("process_cpu_seconds_total{a=\"b\"} 2\n"),
            Some(2.0)
        );
        assert_eq!(parse_cpu("process_cpu_seconds_created 1\n"), None);
        assert_eq!(parse_cpu("felix_broker_ready 1\n"), None);
    }

    #[test]
    fn own_cpu_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(own_cpu_seconds().is_some());
        }
    }
}
