//! The tidy test: fails, naming each place, when the tree breaks a rule of `felix_tidy`.

use std::path::{Path, PathBuf};
use std::process::Command;

use felix_tidy::{
    arrow_violations, code_only, core_violations, declared_mods, module_dead_code, path_attributes,
    strip_test_items, Violation, ARROW_RULES,
};

/// The Sans-IO core: each root module file, walked through its `mod` declarations.
const CORE_ROOTS: &[&str] = &[
    "felix-proto/src/lib.rs",
    "felix-peer-proto/src/lib.rs",
    "felix-storage/src/lib.rs",
    "felix-auth/src/lib.rs",
    "felix-cluster/src/lib.rs",
    "felix-engine/src/lib.rs",
    "felix-client/src/core/mod.rs",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

/// Every `.rs` file of the tree (the fuzz crate too), outside build output.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if p.is_dir() {
            if !matches!(name, "target" | ".git" | "corpus" | "artifacts") && !name.starts_with('.')
            {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

fn report(what: &str, v: Vec<Violation>) {
    assert!(
        v.is_empty(),
        "{what}:\n{}",
        v.iter().map(|v| format!("  {v}\n")).collect::<String>()
    );
}

#[test]
fn no_path_attributes() {
    let mut files = Vec::new();
    rust_files(&root(), &mut files);
    assert!(files.len() > 100, "the walk found the tree");
    let mut v = Vec::new();
    for f in &files {
        v.extend(path_attributes(
            &rel(f),
            &std::fs::read_to_string(f).unwrap(),
        ));
    }
    report("path attributes on modules", v);
}

#[test]
fn no_module_wide_dead_code_allowances() {
    let mut files = Vec::new();
    rust_files(&root(), &mut files);
    let mut v = Vec::new();
    for f in &files {
        v.extend(module_dead_code(
            &rel(f),
            &std::fs::read_to_string(f).unwrap(),
        ));
    }
    report("module-wide allow(dead_code)", v);
}

/// The module tree under `file`: its non-test code checked, then each declared child.
fn walk_core(file: &Path, v: &mut Vec<Violation>, seen: &mut usize) {
    let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    *seen += 1;
    let (stripped, _test_mods) = strip_test_items(&code_only(&src));
    v.extend(core_violations(&rel(file), &stripped));
    let name = file
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let dir = file.parent().expect("a file has a folder");
    // Children of lib.rs/mod.rs sit beside it; those of foo.rs in foo/.
    let base = if matches!(name, "lib" | "mod") {
        dir.to_path_buf()
    } else {
        dir.join(name)
    };
    for m in declared_mods(&stripped) {
        let flat = base.join(format!("{m}.rs"));
        let nested = base.join(&m).join("mod.rs");
        let child = if flat.exists() { flat } else { nested };
        walk_core(&child, v, seen);
    }
}

#[test]
fn the_core_reads_no_clock_and_touches_no_os() {
    let mut v = Vec::new();
    let mut seen = 0;
    for r in CORE_ROOTS {
        walk_core(&root().join(r), &mut v, &mut seen);
    }
    assert!(seen > 50, "the walk reached the core's modules ({seen})");
    report("the Sans-IO core reaches outside", v);
}

#[test]
fn dependency_arrows_run_one_way() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(meta["packages"].as_array().is_some_and(|p| p.len() > 10));
    report("dependency arrows", arrow_violations(&meta, ARROW_RULES));
}
