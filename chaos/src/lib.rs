//! What the chaos run (`felix-chaos`) and the replication benchmarks (`felix-repl-bench`)
//! share: a real cluster of `felix-broker` processes on loopback, laid out and run
//! (`cluster`), what the tests against it share (`harness`), and the read-back that ends a
//! fault run (`readback`).

pub mod cluster;
pub mod harness;
pub mod readback;
