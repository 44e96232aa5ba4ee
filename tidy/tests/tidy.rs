//! The tidy test: fails, naming each place, when the tree breaks a rule of `felix_tidy`.

use std::path::{Path, PathBuf};
use std::process::Command;

use felix_tidy::{
    arrow_violations, code_only, core_violations, declared_mods, hash_iterations, hash_names,
    hash_violations, module_dead_code, module_violations, path_attributes, strip_test_items,
    Violation, ARROW_RULES, ENGINE_MODULE_RULES, HASH_ITERATION_ALLOWED,
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
    let mut files = Vec::new();
    product_files(file, &mut files);
    *seen += files.len();
    for (f, stripped) in files {
        v.extend(core_violations(&rel(&f), &stripped));
    }
}

/// Every file of the module tree under `file`, with its non-test code.
fn product_files(file: &Path, out: &mut Vec<(PathBuf, String)>) {
    let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let (stripped, _test_mods) = strip_test_items(&code_only(&src));
    out.push((file.to_path_buf(), stripped.clone()));
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
        product_files(&child, out);
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

#[test]
fn felix_engine_modules_reach_only_down() {
    let src = root().join("felix-engine/src");
    let mut files = Vec::new();
    product_files(&src.join("lib.rs"), &mut files);
    assert!(
        files.len() > 40,
        "the walk reached the engine's modules ({})",
        files.len()
    );
    let mut v = Vec::new();
    for (f, stripped) in &files {
        let file = f.strip_prefix(&src).unwrap().display().to_string();
        v.extend(module_violations(&file, stripped, ENGINE_MODULE_RULES));
    }
    report("felix-engine module arrows", v);
}

/// The crates whose order of work must not depend on a hasher's seed.
const HASH_ORDER_ROOTS: &[&str] = &[
    "felix-proto/src/lib.rs",
    "felix-peer-proto/src/lib.rs",
    "felix-storage/src/lib.rs",
    "felix-auth/src/lib.rs",
    "felix-cluster/src/lib.rs",
    "felix-engine/src/lib.rs",
];

#[test]
fn the_core_iterates_no_hash_container() {
    let mut found = Vec::new();
    for r in HASH_ORDER_ROOTS {
        let mut files = Vec::new();
        product_files(&root().join(r), &mut files);
        // A field is often declared in one file and iterated in a sibling.
        let fields: std::collections::BTreeSet<String> =
            files.iter().flat_map(|(_, s)| hash_names(s).0).collect();
        for (f, stripped) in &files {
            let (_, locals) = hash_names(stripped);
            for (line, name) in hash_iterations(stripped, &fields, &locals) {
                found.push((rel(f), line, name));
            }
        }
    }
    assert!(found.len() > 10, "the scan finds the allowed iterations");
    report(
        "iteration over a HashMap/HashSet in the core",
        hash_violations(&found, HASH_ITERATION_ALLOWED),
    );
}
