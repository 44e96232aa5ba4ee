//! `felix-broker`: the Felix broker, on tokio (default) or smol (`--runtime smol` or
//! `FELIX_RUNTIME=smol`), configured from the environment (see
//! `felix_runtime_common::config`). The process logic is `felix_runtime_common::process`;
//! this crate only lists the runtimes, so it is the one place that depends on every adapter.

use std::process::ExitCode;

use felix_runtime_common::process::{main as broker_main, ProcessRuntime};

fn main() -> ExitCode {
    broker_main(&[
        ProcessRuntime {
            name: "tokio",
            run: felix_runtime_tokio::run_process,
        },
        ProcessRuntime {
            name: "smol",
            run: felix_runtime_smol::run_process,
        },
    ])
}
