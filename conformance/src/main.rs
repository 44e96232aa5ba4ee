//! `felix-conformance vectors <dir>`: checks every wire vector in `<dir>`, prints one line per
//! vector, and exits non-zero if any fails.
//!
//! `felix-conformance verify RESULTS [--evidence FILE] [--catalogue FILE]`: judges a client's
//! results document (docs/conformance.md); exit 0 only when CONFORMANT.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [cmd, dir] if cmd == "vectors" => run_vectors(PathBuf::from(dir)),
        [cmd, rest @ ..] if cmd == "verify" => run_verify(rest),
        [cmd, rest @ ..] if cmd == "client-fixture" => run_fixture(rest),
        [cmd, rest @ ..] if cmd == "sdk-suite" => run_sdk_suite(rest),
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

const USAGE: &str = "usage: felix-conformance vectors <dir>
       felix-conformance verify RESULTS.json [--evidence FILE] [--catalogue scenarios.toml]
       felix-conformance client-fixture --out fixture.json --ca-file brokers.pem [--evidence FILE] [--broker PATH]
         [--canary serve-redirects-locally]
       felix-conformance sdk-suite --out DIR [--fixture fixture.json] [--only ID-PART]...
         [--canary serve-redirects-locally] [--broken-client redirect-as-failure]";

/// `sdk-suite`: felix-client held to the catalogue (docs/conformance.md, "The Rust SDK").
/// Exit 0 when no scenario failed (the verdict is `verify`'s), 1 when one did, 2 on bad use.
fn run_sdk_suite(args: &[String]) -> ExitCode {
    let mut out = None;
    let mut fixture = None;
    let mut only = Vec::new();
    let mut canary = None;
    let mut broken_client = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        };
        match flag.as_str() {
            "--out" => out = Some(PathBuf::from(value)),
            "--fixture" => fixture = Some(PathBuf::from(value)),
            "--only" => only.push(value.clone()),
            "--canary" => canary = Some(value.clone()),
            "--broken-client" => match felix_conformance::sdk_suite::BrokenClient::parse(value) {
                Some(b) => broken_client = Some(b),
                None => {
                    eprintln!("sdk-suite: unknown broken client {value:?}\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(out) = out else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let opts = felix_conformance::sdk_suite::Options {
        out,
        fixture,
        only,
        canary,
        broken_client,
    };
    match felix_conformance::sdk_suite::run(&opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("sdk-suite: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_fixture(args: &[String]) -> ExitCode {
    let mut out = None;
    let mut ca_file = None;
    let mut evidence = None;
    let mut canary = felix_conformance::fixture::Canary::None;
    // The broker built beside this binary (`cargo build --release` puts both in one place).
    let mut broker = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("felix-broker")))
        .unwrap_or_else(|| PathBuf::from("felix-broker"));
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        };
        let value = PathBuf::from(value);
        match flag.as_str() {
            "--out" => out = Some(value),
            "--ca-file" => ca_file = Some(value),
            "--evidence" => evidence = Some(value),
            "--broker" => broker = value,
            "--canary" => match value
                .to_str()
                .and_then(felix_conformance::fixture::Canary::parse)
            {
                Some(c) => canary = c,
                None => {
                    eprintln!("--canary: none or serve-redirects-locally");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let (Some(out), Some(ca_file)) = (out, ca_file) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    // Beside fixture.json unless named.
    let evidence = evidence.unwrap_or_else(|| out.with_file_name("evidence.json"));
    let opts = felix_conformance::fixture::Options {
        out,
        ca_file,
        broker,
        evidence,
        canary,
    };
    match felix_conformance::fixture::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("client-fixture: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Where the catalogue is read from unless `--catalogue` says otherwise: the reference kit's
/// checkout beside the repository, as for `vectors`.
const DEFAULT_CATALOGUE: &str = "../shared/reference/felix/conformance/scenarios.toml";

fn run_verify(args: &[String]) -> ExitCode {
    let mut results = None;
    let mut evidence = None;
    let mut catalogue = PathBuf::from(DEFAULT_CATALOGUE);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.clone().next()) {
            ("--evidence", Some(v)) => {
                evidence = Some(PathBuf::from(v));
                it.next();
            }
            ("--catalogue", Some(v)) => {
                catalogue = PathBuf::from(v);
                it.next();
            }
            (f, _) if !f.starts_with("--") && results.is_none() => results = Some(PathBuf::from(f)),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(results) = results else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
    };
    use felix_conformance::verify::{verify, Catalogue, Evidence, Results};
    let parsed = (|| {
        let c = Catalogue::parse(&read(&catalogue)?)?;
        let r = Results::parse(&read(&results)?)?;
        let e = match &evidence {
            Some(p) => Some(Evidence::parse(&read(p)?)?),
            None => None,
        };
        Ok::<_, String>((c, r, e))
    })();
    let (c, r, e) = match parsed {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let verdict = verify(&c, &r, e.as_ref());
    print!("{}", verdict.render());
    if verdict.conformant() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run_vectors(dir: PathBuf) -> ExitCode {
    let results = match felix_conformance::vectors::check_dir(&dir) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot read {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    };
    let mut failed = 0;
    for r in &results {
        match &r.outcome {
            Ok(()) => println!("PASS {}", r.name),
            Err(why) => {
                failed += 1;
                println!("FAIL {}: {why}", r.name);
            }
        }
    }
    if results.is_empty() {
        println!("no vectors found in {}", dir.display());
        return ExitCode::FAILURE;
    }
    println!(
        "vectors: {} passed, {} failed",
        results.len() - failed,
        failed
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
