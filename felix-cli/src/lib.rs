//! The parts of the `felix` command line that other tools reuse: [`layout`], the files of a
//! local cluster (`felix cluster up`, and the chaos test in `chaos/`).

pub mod layout;
