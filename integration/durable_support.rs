//! Shared by the `durable_*` tests: a broker on a temporary storage directory, restartable
//! on the same directory, and clients for it.

use std::path::{Path, PathBuf};

use crate::{client_config, start_broker, unique, within};
use felix_client::{Client, ClientConfig};
use felix_runtime_tokio::felix_engine::{DurableConfig, FsyncPolicy};
use felix_runtime_tokio::{BrokerOptions, RunningBroker};

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(unique(prefix));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn on_commit() -> DurableConfig {
    let mut durable_config = DurableConfig::default();
    durable_config.fsync = FsyncPolicy::OnCommit;
    durable_config
}

pub fn periodic() -> DurableConfig {
    DurableConfig::default()
}

/// A durable broker on 127.0.0.1:0 storing under `dir`.
pub async fn start(dir: &Path, durable: DurableConfig) -> RunningBroker {
    let mut opts = BrokerOptions::new("127.0.0.1:0".parse().expect("literal"));
    opts.storage_dir = Some(dir.to_path_buf());
    opts.durable = durable;
    within(20, start_broker(opts))
        .await
        .expect("durable broker starts")
}

/// A client configuration for `broker` with its dev token.
pub fn config(broker: &RunningBroker) -> ClientConfig {
    client_config(
        broker.local_addr(),
        broker.ca_cert_pem().as_bytes().to_vec(),
        broker.dev_token().expect("dev mode"),
    )
}

pub async fn client(broker: &RunningBroker) -> Client {
    client_with(broker, |_| {}).await
}

pub async fn client_with(broker: &RunningBroker, adjust: impl FnOnce(&mut ClientConfig)) -> Client {
    let mut config = config(broker);
    adjust(&mut config);
    within(15, Client::connect(config))
        .await
        .expect("client connects")
}

pub async fn stop(broker: RunningBroker) {
    within(20, broker.shutdown()).await.expect("clean shutdown");
}
