//! `felix-broker`: the Felix broker on tokio, configured from the environment
//! (see `felix_runtime_tokio::config`). Stops cleanly on SIGINT or SIGTERM: every connection
//! is closed with code 0 and the process exits 0.

use std::io;
use std::path::Path;
use std::process::ExitCode;

use felix_runtime_tokio::{config, start};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .init();

    let config = match config::from_env() {
        Ok(c) => c,
        Err(e) => {
            error!("configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(config: config::Config) -> io::Result<()> {
    let broker = start(config.options).await?;
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
    wait_for_signal().await?;
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

#[cfg(unix)]
async fn wait_for_signal() -> io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM"),
        _ = int.recv() => info!("SIGINT"),
    }
    Ok(())
}

#[cfg(not(unix))]
async fn wait_for_signal() -> io::Result<()> {
    tokio::signal::ctrl_c().await
}
