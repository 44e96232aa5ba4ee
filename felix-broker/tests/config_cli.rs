//! `felix-broker --config FILE --print-config`: the file plus environment overrides give the
//! printed effective configuration, each value with its source; a bad key in the file stops
//! the binary with exit code 2, naming the key.

use std::path::PathBuf;
use std::process::Command;

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("felix-config-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn broker() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_felix-broker"));
    // Only what each test sets: no FELIX_* from the environment running the tests.
    for (name, _) in std::env::vars() {
        if name.starts_with("FELIX_") {
            cmd.env_remove(name);
        }
    }
    cmd
}

#[test]
fn print_config_shows_file_values_env_overrides_and_defaults() {
    let path = temp_file(
        "ok.toml",
        r#"
metrics_bind = "127.0.0.1:9100"
[limits]
publish_window = 32
max_connections_per_ip = 8
[tls]
require_alpn = true
[[streams]]
tenant = "t1"
namespace = "orders"
stream = "created"
shards = 3
"#,
    );
    let out = broker()
        .args(["--config", path.to_str().unwrap(), "--print-config"])
        .env("FELIX_PUBLISH_WINDOW", "64")
        .env("FELIX_MAX_BUFFERED_BYTES", "1000000")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |prefix: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{stdout}"))
    };
    let file = format!("# file {}", path.display());
    assert!(line("metrics_bind = \"127.0.0.1:9100\"").contains(&file));
    assert!(line("publish_window = 64").contains("# env FELIX_PUBLISH_WINDOW"));
    assert!(line("max_connections_per_ip = 8").contains(&file));
    assert!(line("max_buffered_bytes = 1000000").contains("# env FELIX_MAX_BUFFERED_BYTES"));
    assert!(line("require_alpn = true").contains(&file));
    assert!(line("quic_bind = \"127.0.0.1:5000\"").contains("# default"));
    assert!(line("[[streams]]").contains(&file));
    assert!(stdout.contains("shards = 3"));

    // FELIX_CONFIG names the file just as well.
    let out = broker()
        .arg("--print-config")
        .env("FELIX_CONFIG", &path)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("publish_window = 32"));
}

#[test]
fn a_bad_key_is_refused_with_its_name_and_exit_code_2() {
    let path = temp_file("bad.toml", "[limits]\nmax_frame_bytez = 5\n");
    let out = broker()
        .args(["--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`limits.max_frame_bytez`"), "{stderr}");
    assert!(stderr.contains("unknown key"), "{stderr}");

    let out = broker()
        .arg("--print-config")
        .env("FELIX_MAX_CONNECTIONS_PER_IP", "several")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("FELIX_MAX_CONNECTIONS_PER_IP"), "{stderr}");
}

/// The binary lifts its soft open-file limit to the hard one: a durable broker holds two
/// handles per log file it appends to, more than the usual soft limit of 1024 allows.
#[cfg(target_os = "linux")]
#[test]
fn the_broker_raises_its_open_file_limit_to_the_hard_limit() {
    use std::time::{Duration, Instant};
    // (soft, hard) "Max open files" of a process, from /proc.
    let limits = |pid: u32| -> Option<(String, String)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
        let line = text.lines().find(|l| l.starts_with("Max open files"))?;
        let mut fields = line["Max open files".len()..].split_whitespace();
        Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
    };
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -Sn 256 && exec \"$0\""])
        .arg(env!("CARGO_BIN_EXE_felix-broker"))
        .env("FELIX_QUIC_BIND", "127.0.0.1:0")
        .env("FELIX_METRICS_BIND", "off")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = None;
    // Until `sh` has lowered the limit and exec'd the broker, the pid is not the broker.
    let is_broker = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() == "felix-broker")
    };
    while Instant::now() < deadline {
        if is_broker(child.id()) {
            seen = limits(child.id());
            if seen.as_ref().is_some_and(|(soft, hard)| soft == hard) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let (soft, hard) = seen.expect("the broker's limits were readable");
    assert_ne!(
        hard, "256",
        "the test needs a hard limit above the lowered soft one"
    );
    assert_eq!(soft, hard, "soft limit raised from 256");
}
