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
    let args = match parse_args(&args) {
        Ok(Some(args)) => args,
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
    let config = match config::load(args.config.as_deref(), config::env_var) {
        Ok(c) => c,
        Err(e) => {
            error!("configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        print!("{}", config.effective.render());
        return ExitCode::SUCCESS;
    }
    let runtime = match choose_runtime(args.runtime.as_deref(), config.runtime.as_deref(), runtimes)
    {
        Ok(runtime) => runtime,
        Err(e) => {
            error!("{e}");
            eprintln!("{}", usage(runtimes));
            return ExitCode::from(2);
        }
    };
    raise_open_file_limit();
    match (runtime.run)(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Lifts the soft limit on open files to the hard one, as servers do: a durable broker
/// keeps a read handle and a direct-append handle per log file it writes (up to
/// `files::MAX_OPEN_FILES` of each) besides its sockets, and the usual soft limit of 1024
/// is below that.
#[cfg(target_os = "linux")]
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: both calls only read or write the struct passed, which outlives them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max
        {
            return;
        }
        let before = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
            tracing::debug!(before, after = limit.rlim_cur, "raised the open file limit");
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn raise_open_file_limit() {}

fn usage(runtimes: &[ProcessRuntime]) -> String {
    let names: Vec<&str> = runtimes.iter().map(|r| r.name).collect();
    format!(
        "usage: felix-broker [--runtime {}] [--config FILE] [--print-config]\n\
         The runtime may also be named by {RUNTIME_VAR} or `runtime` in the file (default {}).\n\
         Settings come from the TOML file (--config, or FELIX_CONFIG), overridden by FELIX_*\n\
         environment variables; --print-config shows the result and each value's source\n\
         (docs/operations.md lists every setting).",
        names.join("|"),
        names.first().copied().unwrap_or("none"),
    )
}

/// What the command line asked for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Args {
    runtime: Option<String>,
    config: Option<std::path::PathBuf>,
    print_config: bool,
}

/// The arguments; `None` asks for the usage.
fn parse_args(args: &[String]) -> Result<Option<Args>, String> {
    let mut out = Args::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => args.next().cloned().ok_or(format!("{name} needs a value")),
            }
        };
        match flag {
            "-h" | "--help" => return Ok(None),
            "--runtime" => out.runtime = Some(value("--runtime")?),
            "--config" => out.config = Some(value("--config")?.into()),
            "--print-config" => out.print_config = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(out))
}

/// The runtime the flag names, else the configuration (file or `FELIX_RUNTIME`), else the
/// first built in.
fn choose_runtime<'r>(
    flag: Option<&str>,
    configured: Option<&str>,
    runtimes: &'r [ProcessRuntime],
) -> Result<&'r ProcessRuntime, String> {
    match flag.or(configured) {
        None => runtimes
            .first()
            .ok_or_else(|| "no runtime is built in".to_owned()),
        Some(name) => runtimes
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| format!("unknown runtime {name:?}")),
    }
}

/// The process on `runtime`: start, export, wait for SIGINT or SIGTERM, stop cleanly.
pub async fn serve<R: Runtime>(runtime: R, config: Config) -> io::Result<()> {
    // Handlers go in before the broker starts, so an early SIGTERM still stops it cleanly.
    let signal = termination_signal()?;
    let mut options = config.options;
    options.internal_bind = config.internal_bind;
    let mut broker = start(runtime, options).await?;
    broker.watch_files(&config.reload)?;
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
    // The first of: a signal, or the broker stopping itself (its cluster refused it).
    let mut signal = signal;
    let mut failed = broker.take_failure();
    let ended = std::future::poll_fn(|cx| {
        use std::future::Future;
        use std::pin::Pin;
        use std::task::Poll;
        if let Poll::Ready(r) = Pin::new(&mut signal).poll(cx) {
            return Poll::Ready(Ok(r));
        }
        if let Some(f) = failed.as_mut() {
            match Pin::new(f).poll(cx) {
                Poll::Ready(Ok(why)) => return Poll::Ready(Err(why)),
                // The loop ended without a reason: keep waiting for the signal.
                Poll::Ready(Err(_)) => failed = None,
                Poll::Pending => {}
            }
        }
        Poll::Pending
    })
    .await;
    match ended {
        Ok(Ok(name)) => info!("{name}"),
        Ok(Err(_)) => return Err(io::Error::other("the signal thread ended")),
        Err(why) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the cluster refused this node: {why}"),
            ))
        }
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

/// Resolves with the signal's name on the first SIGINT or SIGTERM (which starts the graceful
/// drain); a second one exits the process at once, with 128 + the signal's number. A plain
/// thread waits for them, so no runtime's signal support is needed.
#[cfg(unix)]
fn termination_signal() -> io::Result<oneshot::Receiver<&'static str>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("felix-signals".into())
        .spawn(move || {
            let name = |s| if s == SIGTERM { "SIGTERM" } else { "SIGINT" };
            let mut signals = signals.forever();
            if let Some(signal) = signals.next() {
                let _ = tx.send(name(signal));
            }
            if let Some(signal) = signals.next() {
                error!("second {}: exiting at once", name(signal));
                std::process::exit(128 + signal);
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

    fn choose(args: &[&str], configured: Option<&str>) -> Result<Option<&'static str>, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let Some(args) = parse_args(&args)? else {
            return Ok(None);
        };
        choose_runtime(args.runtime.as_deref(), configured, RUNTIMES).map(|r| Some(r.name))
    }

    #[test]
    fn the_flag_beats_the_configuration_which_beats_the_default() {
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
    fn config_flags_are_read() {
        let args: Vec<String> = ["--config", "/etc/felix.toml", "--print-config"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        let parsed = parse_args(&args).unwrap().unwrap();
        assert_eq!(parsed.config, Some("/etc/felix.toml".into()));
        assert!(parsed.print_config);
        let args = vec!["--config=/x.toml".to_owned()];
        assert_eq!(
            parse_args(&args).unwrap().unwrap().config,
            Some("/x.toml".into())
        );
    }

    #[test]
    fn unknown_runtimes_and_arguments_are_refused() {
        assert!(choose(&[], Some("async-std"))
            .unwrap_err()
            .contains("async-std"));
        assert!(choose(&["--runtime"], None).unwrap_err().contains("value"));
        assert!(choose(&["--config"], None).unwrap_err().contains("value"));
        assert!(choose(&["--port", "1"], None)
            .unwrap_err()
            .contains("--port"));
        assert!(usage(RUNTIMES).contains("tokio|smol"));
    }
}
