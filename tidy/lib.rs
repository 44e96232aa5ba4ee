//! The rules `tests/tidy.rs` holds the workspace to, as pure functions over source text and
//! `cargo metadata`, so each rule can be shown catching a planted violation.
//!
//! - No `path` attribute on a module anywhere: a file's place in the tree is its place in the crate.
//! - The Sans-IO core (felix-proto, felix-peer-proto, felix-storage, felix-auth, felix-engine,
//!   the client's `core/`) reads no clock, draws no OS randomness and touches no file, socket, thread or
//!   lock outside test code.
//! - No module-wide `allow(dead_code)`: dead code is deleted, test-only code is `cfg(test)`.
//! - Dependency arrows run one way (see [`ARROW_RULES`]).

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
}
