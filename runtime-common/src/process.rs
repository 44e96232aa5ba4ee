//! The `felix-broker` process, written once for every runtime: pick the runtime
//! (`--runtime NAME` or `FELIX_RUNTIME`, the first one listed by default), read the
//! configuration from the environment ([`crate::config`]), start, export the CA and dev
//! token, and stop cleanly on SIGINT or SIGTERM: every connection is closed with code 0 and
//! the process exits 0. A configuration or usage error exits 2; a failure to run exits 1.

use std::io;
use std::path::Path;
use std::process::ExitCode;

use futures_channel::oneshot;
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

use crate::config::{self, Config};
use crate::{start, Runtime};

/// The variable naming the runtime when no `--runtime` flag is given.
pub const RUNTIME_VAR: &str = "FELIX_RUNTIME";

/// A runtime the binary offers: its name, and how to run the broker process to the end on
/// it (build the runtime, then block on [`serve`]).
#[derive(Debug, Clone, Copy)]
pub struct ProcessRuntime {
    pub name: &'static str,
    pub run: fn(Config) -> io::Result<()>,
}

/// The binary's `main`: `runtimes[0]` is the default.
pub fn main(runtimes: &[ProcessRuntime]) -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .init();

    let args: Vec<String> = std::env::args().skip(1).collect();
    let from_env = std::env::var(RUNTIME_VAR).ok().filter(|v| !v.is_empty());
    let runtime = match choose_runtime(&args, from_env.as_deref(), runtimes) {
        Ok(Some(runtime)) => runtime,
        Ok(None) => {
            println!("{}", usage(runtimes));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            error!("{e}");
            eprintln!("{}", usage(runtimes));
            return ExitCode::from(2);
        }
    };
    let config = match config::from_env() {
        Ok(c) => c,
        Err(e) => {
            error!("configuration: {e}");
            return ExitCode::from(2);
        }
    };
    match (runtime.run)(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn usage(runtimes: &[ProcessRuntime]) -> String {
    let names: Vec<&str> = runtimes.iter().map(|r| r.name).collect();
    format!(
        "usage: felix-broker [--runtime {}]\n\
         The runtime may also be named by {RUNTIME_VAR} (default {}); everything else is\n\
         configured by FELIX_* environment variables (see docs and felix_runtime_common::config).",
        names.join("|"),
        names.first().copied().unwrap_or("none"),
    )
}

/// The runtime the arguments (first) or the environment name; `None` asks for the usage.
fn choose_runtime<'r>(
    args: &[String],
    from_env: Option<&str>,
    runtimes: &'r [ProcessRuntime],
) -> Result<Option<&'r ProcessRuntime>, String> {
    let mut name = from_env.map(str::to_owned);
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--runtime" => {
                let value = args.next().ok_or("--runtime needs a value")?;
                name = Some(value.clone());
            }
            other => match other.strip_prefix("--runtime=") {
                Some(value) => name = Some(value.to_owned()),
                None => return Err(format!("unknown argument {other:?}")),
            },
        }
    }
    match name {
        None => runtimes
            .first()
            .map(Some)
            .ok_or_else(|| "no runtime is built in".to_owned()),
        Some(name) => runtimes
            .iter()
            .find(|r| r.name == name)
            .map(Some)
            .ok_or_else(|| format!("unknown runtime {name:?}")),
    }
}

/// The process on `runtime`: start, export, wait for SIGINT or SIGTERM, stop cleanly.
pub async fn serve<R: Runtime>(runtime: R, config: Config) -> io::Result<()> {
    // Handlers go in before the broker starts, so an early SIGTERM still stops it cleanly.
    let signal = termination_signal()?;
    let broker = start(runtime, config.options).await?;
    if let Some(path) = &config.tls_cert_export {
        write_atomically(path, broker.ca_cert_pem().as_bytes())?;
        info!(path = %path.display(), "wrote the CA certificate");
    }
    if let Some(token) = broker.dev_token() {
        match &config.dev_token_export {
            Some(path) => {
                write_atomically(path, token.as_bytes())?;
                info!(path = %path.display(), "dev mode: wrote the token for tenant t1");
            }
            None => info!(
                "dev mode: set FELIX_DEV_TOKEN_EXPORT to write the token for tenant t1 to a file"
            ),
        }
    }
    match signal.await {
        Ok(name) => info!("{name}"),
        Err(_) => return Err(io::Error::other("the signal thread ended")),
    }
    broker.shutdown().await?;
    info!("stopped");
    Ok(())
}

/// Writes beside the target and renames, so a reader never sees a half-written file.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Resolves with the signal's name on the first SIGINT or SIGTERM. A plain thread waits
/// for it, so no runtime's signal support is needed.
#[cfg(unix)]
fn termination_signal() -> io::Result<oneshot::Receiver<&'static str>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("felix-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                let _ = tx.send(if signal == SIGTERM {
                    "SIGTERM"
                } else {
                    "SIGINT"
                });
            }
        })?;
    Ok(rx)
}

/// Without unix signals the process stops when its standard input closes.
#[cfg(not(unix))]
fn termination_signal() -> io::Result<oneshot::Receiver<&'static str>> {
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("felix-stdin".into())
        .spawn(move || {
            let _ = io::copy(&mut io::stdin(), &mut io::sink());
            let _ = tx.send("standard input closed");
        })?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: Config) -> io::Result<()> {
        unreachable!("not run in these tests")
    }

    const RUNTIMES: &[ProcessRuntime] = &[
        ProcessRuntime {
            name: "tokio",
            run: never,
        },
        ProcessRuntime {
            name: "smol",
            run: never,
        },
    ];

    fn choose(args: &[&str], env: Option<&str>) -> Result<Option<&'static str>, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        choose_runtime(&args, env, RUNTIMES).map(|r| r.map(|r| r.name))
    }

    #[test]
    fn the_flag_beats_the_environment_which_beats_the_default() {
        assert_eq!(choose(&[], None), Ok(Some("tokio")));
        assert_eq!(choose(&[], Some("smol")), Ok(Some("smol")));
        assert_eq!(
            choose(&["--runtime", "smol"], Some("tokio")),
            Ok(Some("smol"))
        );
        assert_eq!(
            choose(&["--runtime=tokio"], Some("smol")),
            Ok(Some("tokio"))
        );
        assert_eq!(choose(&["--help"], None), Ok(None));
    }

    #[test]
    fn unknown_runtimes_and_arguments_are_refused() {
        assert!(choose(&[], Some("async-std"))
            .unwrap_err()
            .contains("async-std"));
        assert!(choose(&["--runtime"], None).unwrap_err().contains("value"));
        assert!(choose(&["--port", "1"], None)
            .unwrap_err()
            .contains("--port"));
        assert!(usage(RUNTIMES).contains("tokio|smol"));
    }
}
