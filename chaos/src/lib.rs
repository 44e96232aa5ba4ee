//! What the chaos run (`felix-chaos`) and the replication benchmarks (`felix-repl-bench`)
//! share: a real cluster of `felix-broker` processes on loopback, laid out and run
//! (`cluster`), and what the tests against it share (`harness`).

pub mod cluster;
pub mod harness;
