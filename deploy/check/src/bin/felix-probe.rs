//! `felix-probe [HOST:PORT [PATH]]`: one `GET` to the broker's ops endpoint (default
//! `127.0.0.1:8080 /readyz`), exit 0 on a 200 and 1 otherwise. The image's `HEALTHCHECK`
//! and the chart's exec probes run it: the image has no shell and no curl. Std only, so it
//! adds a few hundred kilobytes to the image.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

/// The whole exchange (connect, write, read) is bounded by this per step; a probe runner's
/// own timeout (the image's is 3 s) is the outer bound.
const STEP_TIMEOUT: Duration = Duration::from_secs(2);
/// Enough for the status line of any answer.
const MAX_HEAD: usize = 1024;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let target = args.next().unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    let path = args.next().unwrap_or_else(|| "/readyz".to_owned());
    match probe(&target, &path) {
        Ok(200) => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("felix-probe: GET {path} on {target}: {status}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("felix-probe: GET {path} on {target}: {e}");
            ExitCode::from(1)
        }
    }
}

fn probe(target: &str, path: &str) -> Result<u16, String> {
    let addr: SocketAddr = target
        .to_socket_addrs()
        .map_err(|e| format!("address: {e}"))?
        .next()
        .ok_or("the address resolves to nothing")?;
    let mut conn = TcpStream::connect_timeout(&addr, STEP_TIMEOUT).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(STEP_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(STEP_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    // One write: a server may answer, and close, as soon as the request is whole.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < MAX_HEAD {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) => return Err(e.to_string()),
        }
    }
    status(&head).ok_or_else(|| "no HTTP status line in the answer".to_owned())
}

/// The status code of an answer's first line (`HTTP/1.1 200 OK`).
fn status(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    words.next().filter(|w| w.starts_with("HTTP/"))?;
    words.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_status_line_is_read_and_anything_else_refused() {
        assert_eq!(status(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status(b"HTTP/1.1 503 Service Unavailable\r\nx"), Some(503));
        assert_eq!(status(b"SSH-2.0-x\r\n"), None);
        assert_eq!(status(b""), None);
    }

    /// Against a one-answer server on loopback: the probe sees what it was answered.
    #[test]
    fn the_probe_reports_the_servers_answer() {
        for (answer, want) in [
            ("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Ok(200)),
            ("HTTP/1.1 503 Service Unavailable\r\n\r\n", Ok(503)),
        ] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = std::thread::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                let (mut request, mut buf) = (Vec::new(), [0u8; 512]);
                while !request.ends_with(b"\r\n\r\n") {
                    let n = conn.read(&mut buf).unwrap();
                    assert!(n > 0, "the request ended early");
                    request.extend_from_slice(&buf[..n]);
                }
                conn.write_all(answer.as_bytes()).unwrap();
                String::from_utf8_lossy(&request).into_owned()
            });
            assert_eq!(probe(&addr.to_string(), "/readyz"), want);
            let request = server.join().unwrap();
            assert!(request.starts_with("GET /readyz HTTP/1.1\r\n"), "{request}");
        }
    }

    #[test]
    fn nothing_listening_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        assert!(probe(&addr.to_string(), "/readyz").is_err());
    }
}
