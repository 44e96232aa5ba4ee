//! The rules `tests/tidy.rs` holds the workspace to, as pure functions over source text and
//! `cargo metadata`, so each rule can be shown catching a planted violation.
//!
//! - No `path` attribute on a module anywhere: a file's place in the tree is its place in the crate.
//! - The Sans-IO core (felix-proto, felix-peer-proto, felix-storage, felix-auth, felix-cluster, felix-engine,
//!   the client's `core/`) reads no clock, draws no OS randomness and touches no file, socket, thread or
//!   lock outside test code.
//! - No module-wide `allow(dead_code)`: dead code is deleted, test-only code is `cfg(test)`.
//! - Dependency arrows run one way (see [`ARROW_RULES`]).
//! - Inside felix-engine, module arrows run one way too (see [`ENGINE_MODULE_RULES`]).
//! - No iteration over a `HashMap`/`HashSet` in the core, whose order could reach an output
//!   (see [`hash_iterations`]), but where [`HASH_ITERATION_ALLOWED`] shows it cannot.

use std::collections::BTreeSet;

/// The attribute that compiles a file from somewhere else, spelled so this file does not
/// contain it.
pub const PATH_ATTRIBUTE: &str = concat!("#", "[path");

/// What the core must not name outside test code, and why.
pub const CORE_FORBIDDEN: &[(&str, &str)] = &[
    ("Instant::now", "reads the clock: take `now` as an input"),
    (
        "SystemTime::now",
        "reads the clock: take Unix time from the anchor",
    ),
    (
        "thread_rng",
        "OS randomness: derive it from the configured seed",
    ),
    ("OsRng", "OS randomness: derive it from the configured seed"),
    (
        "getrandom",
        "OS randomness: derive it from the configured seed",
    ),
    ("std::fs", "touches files: emit a FileOp"),
    (
        "std::net",
        "sockets live in the runtime (addresses are core::net)",
    ),
    ("std::thread", "threads live in the runtime"),
    ("Mutex", "locks live in the runtime"),
    ("RwLock", "locks live in the runtime"),
    ("Condvar", "locks live in the runtime"),
    ("tokio", "the core runs under any runtime"),
    ("smol", "the core runs under any runtime"),
];

/// A rule broken at a place.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub place: String,
    pub what: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.place, self.what)
    }
}

/// Source with comments, string literals and char literals blanked (newlines kept, so line
/// numbers stay), leaving only code to search and to match braces in.
pub fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == b'/' && next == Some(b'/') {
            while i < b.len() && b[i] != b'\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'/' && next == Some(b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(next, Some(b'"') | Some(b'#')) && !ident_before(b, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let end = find(b, j + 1, &close).map_or(b.len(), |e| e + close.len());
            for &x in &b[i..end] {
                blank(&mut out, x);
            }
            i = end;
        } else if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let len = if next == Some(b'\\') {
                b[i + 2..].iter().position(|&x| x == b'\'').map(|p| p + 3)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(3)
            } else {
                // A multi-byte char: up to 4 bytes, then the quote.
                (2..=5)
                    .find(|&n| b.get(i + n) == Some(&b'\'') && next.is_some_and(|x| x >= 0x80))
                    .map(|n| n + 1)
            };
            match len {
                Some(n) => {
                    out.resize(out.len() + n, b' ');
                    i += n;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    (from..=hay.len().saturating_sub(needle.len())).find(|&k| hay[k..].starts_with(needle))
}

/// Whether an attribute's text (`#[cfg(...)]`) compiles its item only for tests or test
/// support: it names `test` (or a `test-support`/`testing` feature) and negates nothing.
pub fn is_test_cfg(attr: &str) -> bool {
    let a: String = attr.chars().filter(|c| !c.is_whitespace()).collect();
    a.starts_with("#[cfg(")
        && !a.contains("not(")
        && (a.contains("(test") || a.contains(",test") || a.contains("feature=\"test"))
}

/// `code` (from [`code_only`]) with every item under a test-only `cfg` blanked, and the
/// names of the `mod NAME;` declarations that were test-only (their files are test code).
pub fn strip_test_items(code: &str) -> (String, Vec<String>) {
    let b = code.as_bytes();
    let mut out = b.to_vec();
    let mut test_mods = Vec::new();
    let mut i = 0;
    while let Some(at) = find(b, i, b"#[cfg(") {
        // The attribute ends at its matching `]`.
        let Some(attr_end) = matching(b, at + 1, b'[', b']') else {
            break;
        };
        let attr = &code[at..=attr_end];
        if !is_test_cfg(attr) {
            i = attr_end + 1;
            continue;
        }
        // The item runs to its first `;` or to the `}` matching its first `{`, whichever
        // comes first at depth zero (parentheses and brackets skipped).
        let mut j = attr_end + 1;
        let mut depth = 0i32;
        let end = loop {
            match b.get(j) {
                None => break b.len() - 1,
                Some(b'(' | b'[') => depth += 1,
                Some(b')' | b']') => depth -= 1,
                Some(b';') if depth == 0 => break j,
                Some(b'{') if depth == 0 => {
                    break matching(b, j, b'{', b'}').unwrap_or(b.len() - 1)
                }
                _ => {}
            }
            j += 1;
        };
        let item = &code[attr_end + 1..=end];
        let words: Vec<&str> = item.split_whitespace().collect();
        if let Some(p) = words.iter().position(|w| *w == "mod") {
            if let Some(name) = words.get(p + 1) {
                if item.trim_end().ends_with(';') {
                    test_mods.push(name.trim_end_matches(';').to_owned());
                }
            }
        }
        for x in &mut out[at..=end] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
        i = end + 1;
    }
    (String::from_utf8_lossy(&out).into_owned(), test_mods)
}

/// Index of the `close` matching the `open` at `at`.
fn matching(b: &[u8], at: usize, open: u8, close: u8) -> Option<usize> {
    let mut depth = 0;
    for (k, &c) in b.iter().enumerate().skip(at) {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return Some(k);
            }
        }
    }
    None
}

/// Every `mod NAME;` a file declares (outside test items), to walk the module tree.
pub fn declared_mods(stripped: &str) -> Vec<String> {
    let mut mods = Vec::new();
    for line in stripped.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let Some(p) = words.iter().position(|w| *w == "mod") {
            if let Some(name) = words.get(p + 1) {
                if let Some(name) = name.strip_suffix(';') {
                    mods.push(name.to_owned());
                }
            }
        }
    }
    mods
}

/// Lines of one file that hold a `path` attribute (see [`PATH_ATTRIBUTE`]).
pub fn path_attributes(file: &str, src: &str) -> Vec<Violation> {
    code_only(src)
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(PATH_ATTRIBUTE))
        .map(|(n, _)| Violation {
            place: format!("{file}:{}", n + 1),
            what: "a path attribute on a module: move the file where its module is".into(),
        })
        .collect()
}

/// Module-wide `allow(dead_code)`: an inner `#![allow(dead_code)]`, or an outer one (or a
/// `cfg_attr` granting it) on a `mod` item.
pub fn module_dead_code(file: &str, src: &str) -> Vec<Violation> {
    let code = code_only(src);
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        if !compact.contains("allow(dead_code)") {
            continue;
        }
        let inner = compact.starts_with("#![");
        let on_mod = lines[n + 1..]
            .iter()
            .map(|l| l.trim())
            .find(|l| !l.is_empty() && !l.starts_with("#["))
            .is_some_and(|l| l.split_whitespace().take(3).any(|w| w == "mod"));
        if inner || on_mod {
            found.push(Violation {
                place: format!("{file}:{}", n + 1),
                what: "allow(dead_code) over a whole module: delete the dead code, or cfg(test) it"
                    .into(),
            });
        }
    }
    found
}

/// Forbidden names in one core file's non-test code.
pub fn core_violations(file: &str, stripped: &str) -> Vec<Violation> {
    let mut found = Vec::new();
    for (n, line) in stripped.lines().enumerate() {
        for (name, why) in CORE_FORBIDDEN {
            if contains_word(line, name) {
                found.push(Violation {
                    place: format!("{file}:{}", n + 1),
                    what: format!("`{name}` in the Sans-IO core: {why}"),
                });
            }
        }
    }
    found
}

/// `name` in `line` not as part of a longer identifier.
fn contains_word(line: &str, name: &str) -> bool {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(name).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// One dependency arrow rule: no package in `from` may depend (any kind: normal, dev,
/// build) on a package matching `to`.
pub struct ArrowRule {
    pub from: &'static [&'static str],
    /// Names, or a prefix ending in `*`.
    pub to: &'static [&'static str],
    pub why: &'static str,
}

const CORE: &[&str] = &[
    "felix-proto",
    "felix-peer-proto",
    "felix-storage",
    "felix-auth",
    "felix-cluster",
    "felix-engine",
];

pub const ARROW_RULES: &[ArrowRule] = &[
    ArrowRule {
        from: &["felix-engine"],
        to: &["felix-runtime-*", "felix-broker"],
        why: "the engine never depends on a runtime",
    },
    ArrowRule {
        from: &["felix-storage", "felix-auth"],
        to: &["felix-*"],
        why: "storage and auth depend on no other workspace crate",
    },
    ArrowRule {
        from: &["felix-peer-proto"],
        to: &[
            "felix-storage",
            "felix-auth",
            "felix-engine",
            "felix-cluster",
            "felix-client",
            "felix-testkit",
            "felix-runtime-*",
            "felix-conformance",
            "raft*",
            "protobuf*",
        ],
        why: "the peer protocol depends on felix-proto alone in the workspace, and never on raft or protobuf (RUSTSEC-2024-0437)",
    },
    ArrowRule {
        from: &["felix-cluster"],
        to: &[
            "felix-storage",
            "felix-auth",
            "felix-engine",
            "felix-client",
            "felix-testkit",
            "felix-runtime-*",
        ],
        why: "the cluster's decisions depend on the peer protocol alone in the workspace; the engine wires them",
    },
    ArrowRule {
        from: &["felix-runtime-tokio"],
        to: &["felix-runtime-smol"],
        why: "the adapters never depend on each other",
    },
    ArrowRule {
        from: &["felix-runtime-smol"],
        to: &["felix-runtime-tokio"],
        why: "the adapters never depend on each other",
    },
    ArrowRule {
        from: &["*"],
        to: &["felix-broker"],
        why: "nothing depends on the binary",
    },
    ArrowRule {
        from: CORE,
        to: &["tokio", "smol", "async-io", "futures*"],
        why: "the core runs under any runtime",
    },
];

fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Every arrow that breaks a rule, from `cargo metadata --no-deps` output.
pub fn arrow_violations(metadata: &serde_json::Value, rules: &[ArrowRule]) -> Vec<Violation> {
    let mut found = BTreeSet::new();
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    for p in &packages {
        let from = p["name"].as_str().unwrap_or_default();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let to = d["name"].as_str().unwrap_or_default();
            let kind = d["kind"].as_str().unwrap_or("normal");
            for rule in rules {
                let applies = rule.from.iter().any(|f| matches(f, from)) && from != to;
                if applies && rule.to.iter().any(|t| matches(t, to)) {
                    found.insert(Violation {
                        place: format!("{from} -> {to} ({kind})"),
                        what: rule.why.into(),
                    });
                }
            }
        }
    }
    found.into_iter().collect()
}

/// One module arrow rule inside felix-engine: product code under the top-level module `from`
/// (`broker` is `broker/…`, `node` is `node.rs`) never names the top-level modules `to`.
pub struct ModuleRule {
    pub from: &'static str,
    pub to: &'static [&'static str],
    pub why: &'static str,
}

pub const ENGINE_MODULE_RULES: &[ModuleRule] = &[
    ModuleRule {
        from: "broker",
        to: &["conn", "cluster", "engine", "router"],
        why: "the broker is the data plane as plain state: sessions and the cluster call it, never the reverse",
    },
    ModuleRule {
        from: "cluster",
        to: &["engine", "conn", "router"],
        why: "the cluster wiring is driven by the engine and answers sessions through values (the router wraps it), never by reaching up",
    },
    ModuleRule {
        from: "conn",
        to: &["cluster"],
        why: "sessions ask the router about a shard, never the cluster driver",
    },
    ModuleRule {
        from: "node",
        to: &["cluster"],
        why: "the shared context holds a router, not the cluster driver",
    },
];

/// The module path of a file under a crate's `src/`: `broker/groups/mod.rs` is
/// `[broker, groups]`, `broker/durable.rs` is `[broker, durable]`, `lib.rs` is `[]`.
fn module_path(file: &str) -> Vec<&str> {
    let mut parts: Vec<&str> = file.split('/').collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.strip_suffix(".rs").unwrap_or(last);
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem);
    }
    parts
}

fn ident_at(b: &[u8], at: usize) -> &str {
    let end = (at..b.len())
        .find(|&k| !(b[k].is_ascii_alphanumeric() || b[k] == b'_'))
        .unwrap_or(b.len());
    std::str::from_utf8(&b[at..end]).unwrap_or_default()
}

/// The top-level modules of its own crate that one file's code names, by line: through
/// `crate::NAME`, `crate::{NAME, …}` and `super::` chains that climb to the crate root.
/// `code` is from [`code_only`] (and [`strip_test_items`] for product code only).
pub fn crate_modules_named(file: &str, code: &str) -> Vec<(usize, String)> {
    let b = code.as_bytes();
    let path = module_path(file);
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_word = !ident_before(b, i) && (i == 0 || b[i - 1] != b'$');
        if starts_word && b[i..].starts_with(b"crate::") {
            let at = i + "crate::".len();
            if b.get(at) == Some(&b'{') {
                // A group: the first name of each comma-separated part at depth one.
                let end = matching(b, at, b'{', b'}').unwrap_or(b.len() - 1);
                let mut depth = 0;
                let mut k = at;
                let mut expect = true;
                while k < end {
                    match b[k] {
                        b'{' => {
                            depth += 1;
                            if depth == 1 {
                                expect = true;
                            }
                        }
                        b'}' => depth -= 1,
                        b',' if depth == 1 => expect = true,
                        c if expect && depth == 1 && (c.is_ascii_alphabetic() || c == b'_') => {
                            found.push((line_of(k), ident_at(b, k).to_owned()));
                            expect = false;
                        }
                        _ => {}
                    }
                    k += 1;
                }
                i = end + 1;
                continue;
            }
            let name = ident_at(b, at);
            if !name.is_empty() {
                found.push((line_of(i), name.to_owned()));
            }
            i = at;
            continue;
        }
        if starts_word && b[i..].starts_with(b"super::") && (i < 2 || &b[i - 2..i] != b"::") {
            let mut ups = 0;
            let mut k = i;
            while b[k..].starts_with(b"super::") {
                ups += 1;
                k += "super::".len();
            }
            // Climbing to the root reaches the module named next; short of it, the file's own.
            if ups >= path.len() {
                let name = ident_at(b, k);
                if !name.is_empty() {
                    found.push((line_of(i), name.to_owned()));
                }
            }
            i = k;
            continue;
        }
        i += 1;
    }
    found
}

/// Where one felix-engine file (its path under `src/`) names a module a rule forbids it, less
/// the arrows `allowed` lists.
pub fn module_violations(file: &str, stripped: &str, rules: &[ModuleRule]) -> Vec<Violation> {
    let Some(&top) = module_path(file).first() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (line, to) in crate_modules_named(file, stripped) {
        for rule in rules.iter().filter(|r| r.from == top) {
            if rule.to.contains(&to.as_str()) {
                found.push(Violation {
                    place: format!("felix-engine/src/{file}:{line}"),
                    what: format!("`{top}` reaches `{to}`: {}", rule.why),
                });
            }
        }
    }
    found
}

/// Iterations over a hash container (whose order may differ from run to run: std's hasher is
/// seeded per process) allowed because none lets that order reach an output:
/// `(file, name, how many, why)`. A count too high for the tree fails the tidy test, so the
/// list only shrinks.
pub const HASH_ITERATION_ALLOWED: &[(&str, &str, usize, &str)] = &[
    (
        "felix-auth/src/lib.rs",
        "keys",
        2,
        "Debug sorts the key ids; `jwks.keys` is the JWKS document's Vec",
    ),
    (
        "felix-storage/src/cache_log/mod.rs",
        "index",
        5,
        "live_offsets, expiry and compaction collect then sort; sweep_expired and a trim only \
         forget keys, which commutes (its only product caller sweeps them all, from compact)",
    ),
    (
        "felix-storage/src/counter_log/mod.rs",
        "sums",
        1,
        "compaction's keep list is sorted",
    ),
    (
        "felix-storage/src/group_log.rs",
        "live",
        2,
        "a sum, and compaction's keep list, which is sorted",
    ),
    (
        "felix-storage/src/group_log.rs",
        "dead",
        1,
        "into compaction's sorted keep list",
    ),
    (
        "felix-storage/src/group_log.rs",
        "redriven",
        1,
        "into compaction's sorted keep list",
    ),
    (
        "felix-storage/src/table.rs",
        "by_dir",
        1,
        "logs_under sorts the ids",
    ),
    (
        "felix-engine/src/broker/cache.rs",
        "entries",
        1,
        "remove_scope removes every entry of a deleted cache's shards: removals commute",
    ),
    ("felix-engine/src/broker/mod.rs", "by_owner", 1, "a maximum"),
    (
        "felix-engine/src/broker/mod.rs",
        "subscribers",
        3,
        "a maximum; the ids whose final frames go out are sorted; a shard's `subscribers` is a \
         Vec in subscription order",
    ),
    (
        "felix-engine/src/broker/groups/mod.rs",
        "polls",
        2,
        "the polls answered when their shard or stream ends are sorted by id",
    ),
    (
        "felix-engine/src/broker/producers.rs",
        "by_id",
        1,
        "each producer's own window is cut, independently of the others",
    ),
    (
        "felix-engine/src/broker/producers.rs",
        "stream_index",
        1,
        "a count, and the oldest producer with ties broken by stream and shard",
    ),
    (
        "felix-engine/src/broker/reads.rs",
        "pending",
        1,
        "failed page reads go in ticket order",
    ),
    (
        "felix-engine/src/broker/watch.rs",
        "map",
        4,
        "two `any` tests; the watches ended or advanced are sorted by id",
    ),
    (
        "felix-engine/src/broker/watch.rs",
        "blocked",
        1,
        "a local Vec taken out of the map of that name, in its own order",
    ),
    (
        "felix-engine/src/engine/mod.rs",
        "value_waiters",
        1,
        "the released cache reads are sorted by ticket",
    ),
    (
        "felix-engine/src/fuzzing.rs",
        "value_waiters",
        1,
        "the released cache reads are sorted by ticket (as in engine/mod.rs)",
    ),
];

/// Names one file declares as a `HashMap` or `HashSet`: `(fields, locals)`. A declaration
/// `NAME: [&[mut]] HashMap<…` may be a field or a parameter, so it is both; `let NAME = HashMap::…`
/// or `let NAME: HashSet<…` is a local.
pub fn hash_names(stripped: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut fields = BTreeSet::new();
    let mut locals = BTreeSet::new();
    for line in stripped.lines() {
        let Some(at) = ["HashMap", "HashSet"]
            .iter()
            .filter_map(|w| {
                line.match_indices(w)
                    .find(|(k, _)| !ident_before(line.as_bytes(), *k))
                    .map(|(k, _)| k)
            })
            .min()
        else {
            continue;
        };
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("let ") {
            let rest = rest.trim_start();
            let rest = rest.strip_prefix("mut ").unwrap_or(rest).trim_start();
            let name = ident_at(rest.as_bytes(), 0);
            if !name.is_empty() {
                locals.insert(name.to_owned());
            }
            continue;
        }
        let before = line[..at].trim_end();
        let before = before.strip_suffix("std::collections::").unwrap_or(before);
        let before = before.strip_suffix("collections::").unwrap_or(before);
        // `NAME: [&['a]] [mut] HashMap`: drop the reference and `mut`, then the colon.
        let mut t = before.trim_end();
        loop {
            let next = t
                .strip_suffix("mut")
                .filter(|r| r.ends_with(|c: char| c.is_whitespace() || c == '&'))
                .or_else(|| t.strip_suffix('&'))
                .map(str::trim_end)
                .or_else(|| {
                    // A lifetime: `&'a`.
                    let k = t.rfind('\'')?;
                    let is_life = t[k + 1..].chars().all(|c| c.is_alphanumeric() || c == '_')
                        && t[..k].ends_with('&');
                    is_life.then(|| t[..k].trim_end())
                });
            match next {
                Some(n) if n.len() < t.len() => t = n,
                _ => break,
            }
        }
        if let Some(t) = t.strip_suffix(':') {
            let t = t.trim_end();
            let start = t
                .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map_or(0, |k| k + 1);
            let name = &t[start..];
            if !name.is_empty() && !name.starts_with(|c: char| c.is_ascii_digit()) {
                fields.insert(name.to_owned());
                locals.insert(name.to_owned());
            }
        }
    }
    (fields, locals)
}

const ITERATING: &[&str] = &[
    ".iter()",
    ".iter_mut()",
    ".keys()",
    ".values()",
    ".values_mut()",
    ".drain()",
    ".into_iter()",
    ".into_keys()",
    ".into_values()",
];

/// Where one file iterates a hash container, as `(line, name)`: `x.NAME.iter()` (and the
/// other iterating methods, across line breaks) or `for … in [&[mut ]]x.NAME {` for a field
/// `NAME` of `fields` (declared a hash container somewhere in the crate); `NAME.keys()` or
/// `for … in &NAME {` for a bare `NAME` of `locals` (declared so in this file).
pub fn hash_iterations(
    stripped: &str,
    fields: &BTreeSet<String>,
    locals: &BTreeSet<String>,
) -> Vec<(usize, String)> {
    let b = stripped.as_bytes();
    let line_of = |at: usize| stripped[..at].matches('\n').count() + 1;
    let mut found = BTreeSet::new();
    for (names, field) in [(fields, true), (locals, false)] {
        for name in names {
            for (k, _) in stripped.match_indices(name.as_str()) {
                let end = k + name.len();
                let longer = b
                    .get(end)
                    .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_');
                if ident_before(b, k) || longer {
                    continue;
                }
                // A field is reached through a dot (`self.x`, `l.x`); a local is not.
                let dotted = k > 0 && b[k - 1] == b'.';
                if dotted != field {
                    continue;
                }
                let after = stripped[end..].trim_start();
                let by_method = ITERATING.iter().any(|m| after.starts_with(m));
                let mut head = stripped[..k].trim_end();
                if field {
                    // `for … in &self.x {`, `for … in &s.inner.x {`: drop the path to the field.
                    head = head
                        .trim_end_matches(|c: char| c.is_alphanumeric() || c == '_' || c == '.');
                }
                head = head.strip_suffix("mut").unwrap_or(head).trim_end();
                head = head.strip_suffix('&').unwrap_or(head).trim_end();
                let by_for = head.ends_with(" in") && after.starts_with('{');
                if by_method || by_for {
                    found.insert((line_of(k), name.clone()));
                }
            }
        }
    }
    found.into_iter().collect()
}

/// The hash iterations `found` (`(file, line, name)`) that [`HASH_ITERATION_ALLOWED`]-style
/// `allowed` entries (`(file, name, count, why)`) do not cover: a file iterating a name more
/// often than allowed breaks the rule at each place; fewer than allowed is a stale entry, whose
/// count must come down (the list only shrinks).
pub fn hash_violations(
    found: &[(String, usize, String)],
    allowed: &[(&str, &str, usize, &str)],
) -> Vec<Violation> {
    let mut groups: std::collections::BTreeMap<(&str, &str), Vec<usize>> = Default::default();
    for (file, line, name) in found {
        groups.entry((file, name)).or_default().push(*line);
    }
    let mut v = Vec::new();
    for ((file, name), lines) in &groups {
        let may = allowed
            .iter()
            .find(|(f, n, _, _)| f == file && n == name)
            .map_or(0, |a| a.2);
        if lines.len() > may {
            v.extend(lines.iter().map(|line| Violation {
                place: format!("{file}:{line}"),
                what: format!(
                    "iterates `{name}`, a HashMap/HashSet ({} such here, {may} allowed): its order \
                     can differ between runs; use a BTreeMap/BTreeSet or sort, or allow-list it \
                     showing the order cannot reach an output",
                    lines.len()
                ),
            }));
        }
    }
    for (file, name, count, _) in allowed {
        let n = groups.get(&(*file, *name)).map_or(0, Vec::len);
        if n < *count {
            v.push(Violation {
                place: (*file).to_owned(),
                what: format!("allowed {count} iterations of `{name}` but {n} remain: lower it"),
            });
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_path_attribute_is_caught_but_not_one_in_a_comment_or_string() {
        let planted = format!("{PATH_ATTRIBUTE} = \"x.rs\"]\nmod x;\n");
        assert_eq!(path_attributes("a.rs", &planted).len(), 1);
        let quiet =
            format!("// {PATH_ATTRIBUTE} in a comment\nconst S: &str = \"{PATH_ATTRIBUTE}\";\n");
        assert!(path_attributes("a.rs", &quiet).is_empty());
    }

    #[test]
    fn clock_reads_are_caught_outside_test_code_only() {
        let src = r#"
fn turn(now: Instant) {}
fn bad() { let t = Instant::now(); }
#[cfg(test)]
mod tests {
    fn ok() { let t = Instant::now(); let s = "}"; let c = '}'; }
}
#[cfg(any(test, feature = "testing"))]
pub fn helper() { let t = std::time::Instant::now(); }
#[cfg(not(test))]
fn also_bad() { std::thread::spawn(|| {}); }
"#;
        let (stripped, _) = strip_test_items(&code_only(src));
        let v = core_violations("e.rs", &stripped);
        let lines: Vec<&str> = v.iter().map(|v| v.place.as_str()).collect();
        assert_eq!(lines, ["e.rs:3", "e.rs:11"], "{v:?}");
    }

    #[test]
    fn test_only_module_files_are_named_and_lookalike_names_are_not_flagged() {
        let src = "#[cfg(test)]\nmod log_tests;\nmod log;\nstruct Smolder; fn tokio_like() {}\n";
        let (stripped, test_mods) = strip_test_items(&code_only(src));
        assert_eq!(test_mods, ["log_tests"]);
        assert_eq!(declared_mods(&stripped), ["log"]);
        assert!(core_violations("x.rs", &stripped).is_empty());
    }

    #[test]
    fn module_wide_dead_code_allowances_are_caught_item_ones_are_not() {
        let src = "#![allow(dead_code)]\n#[cfg_attr(x, allow(dead_code))]\npub(crate) mod a;\n#[allow(dead_code)]\nfn f() {}\n";
        let v = module_dead_code("m.rs", src);
        let lines: Vec<&str> = v.iter().map(|v| v.place.as_str()).collect();
        assert_eq!(lines, ["m.rs:1", "m.rs:2"]);
    }

    #[test]
    fn a_planted_arrow_is_caught() {
        let meta = serde_json::json!({"packages": [
            {"name": "felix-storage", "dependencies": [{"name": "felix-proto", "kind": null}]},
            {"name": "felix-runtime-tokio", "dependencies": [{"name": "felix-runtime-smol", "kind": "dev"}]},
            {"name": "felix-engine", "dependencies": [{"name": "felix-storage", "kind": null}]},
        ]});
        let v = arrow_violations(&meta, ARROW_RULES);
        let places: Vec<&str> = v.iter().map(|v| v.place.as_str()).collect();
        assert_eq!(
            places,
            [
                "felix-runtime-tokio -> felix-runtime-smol (dev)",
                "felix-storage -> felix-proto (normal)"
            ]
        );
    }

    #[test]
    fn the_peer_protocol_may_use_felix_proto_and_nothing_else_of_ours_nor_raft() {
        let meta = serde_json::json!({"packages": [
            {"name": "felix-peer-proto", "dependencies": [
                {"name": "felix-proto", "kind": null},
                {"name": "felix-peer-proto", "kind": "dev"},
                {"name": "felix-storage", "kind": null},
                {"name": "raft-proto", "kind": null},
                {"name": "protobuf", "kind": "dev"},
            ]},
        ]});
        let v = arrow_violations(&meta, ARROW_RULES);
        let places: Vec<&str> = v.iter().map(|v| v.place.as_str()).collect();
        assert_eq!(
            places,
            [
                "felix-peer-proto -> felix-storage (normal)",
                "felix-peer-proto -> protobuf (dev)",
                "felix-peer-proto -> raft-proto (normal)",
            ]
        );
    }

    fn modules_named(file: &str, src: &str) -> Vec<Violation> {
        let (stripped, _) = strip_test_items(&code_only(src));
        module_violations(file, &stripped, ENGINE_MODULE_RULES)
    }

    #[test]
    fn a_planted_module_arrow_is_caught_however_it_is_spelled() {
        let src = r#"use crate::conn::Conn;
use crate::{config::X, cluster::{ClusterNode, peers}};
use super::super::engine::Datagram;
use super::shard::ShardState;
// use crate::router::Router;
fn f() -> crate::engine::Output { let s = "crate::router"; todo!() }
#[cfg(test)]
mod tests { use crate::conn::session; }
"#;
        let v = modules_named("broker/durable.rs", src);
        let places: Vec<String> = v.iter().map(|v| v.to_string()).collect();
        assert_eq!(
            places
                .iter()
                .map(|p| p.split(": ").next().unwrap())
                .collect::<Vec<_>>(),
            [
                "felix-engine/src/broker/durable.rs:1",
                "felix-engine/src/broker/durable.rs:2",
                "felix-engine/src/broker/durable.rs:3",
                "felix-engine/src/broker/durable.rs:6",
            ],
            "{places:#?}"
        );
        assert!(
            places[1].contains("`broker` reaches `cluster`"),
            "{places:?}"
        );
        // The same arrows are fine from a module no rule binds.
        assert!(modules_named("engine/mod.rs", src).is_empty());
        // One `super` from broker/mod.rs already climbs to the root.
        assert_eq!(
            modules_named("broker/mod.rs", "use super::conn::Conn;\n").len(),
            1
        );
        assert!(modules_named("broker/durable.rs", "use super::conn::Conn;\n").is_empty());
    }

    #[test]
    fn each_engine_module_rule_catches_its_planted_arrow() {
        for (file, src) in [
            (
                "cluster/peers.rs",
                "use crate::engine::{Datagram, Transmit};\n",
            ),
            ("cluster/replicas.rs", "fn f(c: &crate::conn::Conn) {}\n"),
            (
                "conn/session/cluster.rs",
                "use crate::cluster::ForwardOutcome;\n",
            ),
            ("node.rs", "use crate::cluster::ClusterNode;\n"),
            // The engine's way to the driver behind a router: not a session's.
            ("conn/mod.rs", "use crate::cluster::Wired;\n"),
            ("broker/mod.rs", "fn f(r: &crate::router::Router) {}\n"),
            // The router wraps the driver; the driver never names it back.
            ("cluster/owners.rs", "use crate::router::OwnerEntry;\n"),
        ] {
            let v = module_violations(file, &code_only(src), ENGINE_MODULE_RULES);
            assert_eq!(v.len(), 1, "{file}: {v:?}");
        }
        // The router is the seam: sessions and the shared context may name it.
        assert!(modules_named("node.rs", "use crate::router::Router;\n").is_empty());
        assert!(
            modules_named("conn/session/cluster.rs", "use crate::router::Router;\n").is_empty()
        );
        assert!(modules_named("cluster/mod.rs", "use crate::net::Datagram;\n").is_empty());
    }

    fn hash_found(file: &str, src: &str) -> Vec<(String, usize, String)> {
        let (stripped, _) = strip_test_items(&code_only(src));
        let (fields, locals) = hash_names(&stripped);
        hash_iterations(&stripped, &fields, &locals)
            .into_iter()
            .map(|(line, name)| (file.to_owned(), line, name))
            .collect()
    }

    #[test]
    fn a_planted_hash_iteration_is_caught_in_each_spelling() {
        let src = r#"struct S<'a> {
    waiters: HashMap<u64, Conn>,
    seen: &'a mut std::collections::HashSet<u64>,
    ordered: BTreeMap<u64, Conn>,
}
fn f(s: &mut S) {
    for (id, c) in &s.waiters {}
    let n = s.waiters.values().count();
    let ids: Vec<_> = s
        .seen
        .iter()
        .collect();
    for (id, c) in &s.ordered {}
    let local = HashSet::new();
    for x in &local {}
    let waiters = vec![1]; // a Vec named like the field
    for w in waiters.iter() {}
    s.waiters.get(&1);
}
#[cfg(test)]
mod tests { fn t(s: &S) { for x in s.waiters.keys() {} } }
"#;
        let found = hash_found("x.rs", src);
        let lines: Vec<(usize, &str)> = found.iter().map(|(_, l, n)| (*l, n.as_str())).collect();
        // Line 17's Vec shares the field's name as a bare local: caught too (a false alarm
        // the allow-list answers, rather than a hash container missed).
        assert_eq!(
            lines,
            [
                (7, "waiters"),
                (8, "waiters"),
                (10, "seen"),
                (15, "local"),
                (17, "waiters")
            ],
            "{found:?}"
        );
        let v = hash_violations(&found, &[]);
        assert_eq!(v.len(), 5);
    }

    #[test]
    fn the_hash_allow_list_counts_and_only_shrinks() {
        let src = "struct S { m: HashMap<u8, u8> }\nfn f(s: &S) { s.m.keys().max(); }\nfn g(s: &S) { for x in s.m.iter() {} }\n";
        let found = hash_found("a.rs", src);
        assert_eq!(found.len(), 2);
        assert!(hash_violations(&found, &[("a.rs", "m", 2, "a max; sorted")]).is_empty());
        // One more than allowed: each place is named.
        let over = hash_violations(&found, &[("a.rs", "m", 1, "a max")]);
        assert_eq!(over.len(), 2, "{over:?}");
        // Fewer than allowed: the entry is stale and must come down.
        let stale = hash_violations(&found, &[("a.rs", "m", 3, "")]);
        assert_eq!(stale.len(), 1);
        assert!(stale[0].what.contains("lower it"), "{stale:?}");
        // An entry for a name that is gone altogether is stale too.
        assert_eq!(hash_violations(&[], &[("a.rs", "m", 1, "")]).len(), 1);
    }
}
