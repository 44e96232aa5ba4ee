//! Scraping the broker's ops endpoint (`/metrics`, `/livez`, `/readyz`) with a plain
//! HTTP/1.1 GET over a std TCP stream.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The status code and body of `GET path`, or `None` when nothing listens.
pub fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(conn, "GET {path} HTTP/1.1\r\nhost: felix\r\n\r\n").ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// Every sample of a scrape: `name{labels}` → value.
pub fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let (status, body) = get(addr, "/metrics").expect("the metrics endpoint answers");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// A sample's value (0 when absent).
pub fn value(samples: &BTreeMap<String, f64>, name: &str) -> f64 {
    samples.get(name).copied().unwrap_or(0.0)
}
