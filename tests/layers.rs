//! The module graph follows the flow of an event: a top-level module of `src/` may refer to
//! modules of its own layer or of the layers below it, never above, and the graph has no
//! cycle. Read from the source (comments and `#[cfg(test)]` items left out), so a new
//! upward `use` fails here before it becomes a knot. ARCHITECTURE.md shows the same layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, bottom first.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "foundation",
        &[
            "clock",
            "mask",
            "metrics",
            "config",
            "telemetry",
            "store",
            "vault",
            "audit",
            "eventlog",
        ],
    ),
    ("platform libraries", &["lark", "bash", "llm"]),
    ("execution", &["exec"]),
    ("workspaces", &["workspace"]),
    ("targets", &["target"]),
    ("authorisation", &["authz"]),
    (
        "control plane and turns",
        &["plane", "turns", "schedule", "lifecycle"],
    ),
    ("gate", &["gate"]),
    ("agent", &["agent"]),
    ("progress", &["progress"]),
    ("chat", &["chat"]),
    ("inbox", &["inbox"]),
    ("schedules firing", &["scheduler"]),
    ("front-ends", &["frontend", "console", "mcp"]),
    ("http", &["http"]),
    ("composition", &["app"]),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, ms)| ms.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("reading src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments, string and char literals (their text replaced by spaces).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#')) {
            // A raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && (b.get(i + 2) == Some(&b'\'') || (b.get(i + 1) == Some(&b'\\')))
        {
            // A char literal ('x', '\n', '\u{..}'); a lifetime has no closing quote nearby.
            let mut j = i + 1;
            if b[j] == b'\\' {
                j += 2;
            } else {
                j += 1;
            }
            while j < b.len() && b[j] != b'\'' {
                j += 1;
            }
            i = j + 1;
            out.push_str("' '");
        } else {
            let ch = src[i..].chars().next().expect("a character");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// The code without `#[cfg(test)]` items: the attribute and what it applies to — an item to
/// its closing brace or semicolon, a field or match arm to its comma (or to the brace that
/// closes what holds it, which is kept).
fn without_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let (mut braces, mut parens) = (0usize, 0usize);
        let mut end = item.len();
        for (k, c) in item.char_indices() {
            match c {
                '(' | '[' => parens += 1,
                ')' | ']' => parens = parens.saturating_sub(1),
                '{' => braces += 1,
                '}' if braces == 0 => {
                    end = k;
                    break;
                }
                '}' => {
                    braces -= 1;
                    if braces == 0 && parens == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' | ',' if braces == 0 && parens == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first path segments after `crate::`, including each name of a `crate::{a, b::c}`
/// group, and what a chain of `super::` long enough to reach the crate root names.
fn referenced(code: &str, depth: usize) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let group = |s: &str, found: &mut BTreeSet<String>| {
        // `s` starts just after `{`: the names at brace depth 1.
        let mut level = 1;
        let mut start = true;
        let mut k = 0;
        let b = s.as_bytes();
        while k < b.len() && level > 0 {
            match b[k] {
                b'{' => level += 1,
                b'}' => level -= 1,
                b',' if level == 1 => start = true,
                c if level == 1 && start && (c.is_ascii_alphanumeric() || c == b'_') => {
                    let name = ident_at(&s[k..]);
                    found.insert(name.to_string());
                    start = false;
                    k += name.len();
                    continue;
                }
                _ => {}
            }
            k += 1;
        }
    };
    let at_root = |s: &str, found: &mut BTreeSet<String>| {
        if let Some(inner) = s.strip_prefix('{') {
            group(inner, found);
        } else {
            let name = ident_at(s);
            if !name.is_empty() {
                found.insert(name.to_string());
            }
        }
    };
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        at_root(&code[i + "crate::".len()..], &mut found);
    }
    for (i, _) in code.match_indices("super::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut rest = &code[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        if ups >= depth {
            at_root(rest, &mut found);
        }
    }
    found
}

/// Each top-level module's references to the other top-level modules, with a file each.
fn graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(&src).ok()?;
            let first = rel.components().next()?.as_os_str().to_str()?;
            Some(first.trim_end_matches(".rs").to_string())
        })
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src/");
        let parts: Vec<String> = rel
            .components()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .collect();
        let top = parts[0].clone();
        if top == "lib" || top == "main" {
            continue;
        }
        // The module path's length: `a/mod.rs` and `a.rs` are `a` (1), `a/b.rs` is `a::b` (2).
        let depth = parts.len() - usize::from(parts.last().is_some_and(|p| p == "mod"));
        let text = std::fs::read_to_string(f).expect("reading a source file");
        let code = without_test_items(&code_only(&text));
        for name in referenced(&code, depth) {
            if name != top && modules.contains(&name) {
                edges
                    .entry(top.clone())
                    .or_default()
                    .entry(name)
                    .or_insert_with(|| rel.display().to_string());
            }
        }
    }
    edges
}

#[test]
fn no_module_refers_to_a_layer_above_it() {
    let edges = graph();
    let mut problems = Vec::new();
    for (from, tos) in &edges {
        let Some(lf) = layer_of(from) else {
            problems.push(format!(
                "src/{from}: not assigned to a layer in tests/layers.rs"
            ));
            continue;
        };
        for (to, file) in tos {
            let Some(lt) = layer_of(to) else {
                problems.push(format!(
                    "src/{to}: not assigned to a layer in tests/layers.rs"
                ));
                continue;
            };
            if lt > lf {
                problems.push(format!(
                    "src/{file}: `{from}` ({}) refers to `{to}` ({}), a layer above it",
                    LAYERS[lf].0, LAYERS[lt].0
                ));
            }
        }
    }
    problems.sort();
    problems.dedup();
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn the_module_graph_has_no_cycle() {
    let edges = graph();
    // Depth-first search for a back edge; the path found is reported.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeMap<String, String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut cycle = path[at..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for to in edges.get(m).into_iter().flat_map(|t| t.keys()) {
            if let Some(c) = visit(to, edges, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        if let Some(cycle) = visit(m, &edges, &mut done, &mut Vec::new()) {
            panic!("a cycle between top-level modules: {}", cycle.join(" → "));
        }
    }
}

/// Only `config` reads the environment. The one other read allowed is the embedded cluster's
/// lookup of PostgreSQL's programs on `PATH`, as any program lookup does.
#[test]
fn only_config_reads_the_environment() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // Modules declared `#[cfg(test)] mod name;` are test code.
    let mut test_modules = BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("reading a source file");
        for (i, _) in text.match_indices("#[cfg(test)]") {
            let after = text[i + "#[cfg(test)]".len()..].trim_start();
            if let Some(rest) = after.strip_prefix("mod ") {
                let name = ident_at(rest);
                if rest[name.len()..].trim_start().starts_with(';') {
                    let dir = f.parent().expect("a parent directory");
                    test_modules.insert(dir.join(format!("{name}.rs")));
                    test_modules.insert(dir.join(name).join("mod.rs"));
                }
            }
        }
    }
    let mut readers = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src/");
        if rel.starts_with("config") || test_modules.contains(f) {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("reading a source file");
        let code = without_test_items(&code_only(&text));
        for call in ["env::var(", "env::vars(", "env::var_os(", "env::vars_os("] {
            if code.contains(call) {
                readers.push(format!("src/{}: {call}", rel.display()));
            }
        }
    }
    readers.retain(|r| r != "src/store/embedded.rs: env::var_os(");
    assert!(
        readers.is_empty(),
        "the environment is read outside config:\n{}",
        readers.join("\n")
    );
}

/// The reader itself: what it must see and what it must not.
#[test]
fn the_reader_sees_paths_and_skips_comments_strings_and_tests() {
    let code = code_only(
        "use crate::{agent::X, chat};\n// crate::lark\n/* crate::inbox */\nlet s = \"crate::http\";\n\
         fn f() { super::super::store::open(); }\n#[cfg(test)]\nmod tests { use crate::app; }\n\
         struct S { a: u8, #[cfg(test)] seen: crate::http::X }\nstruct T { #[cfg(test)] t: crate::inbox::Y, b: u8 }\n\
         #[cfg(test)]\nfn g(a: crate::frontend::A, b: u8) { crate::console::x(); }\n",
    );
    let code = without_test_items(&code);
    let got = referenced(&code, 2);
    let want: BTreeSet<String> = ["agent", "chat", "store"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(got, want);
    // One `super::` from a second-level file stays inside its own module.
    assert!(referenced("super::store::x", 2).is_empty());
    // From a module's root file, `super::` is the crate.
    assert!(referenced("super::store::x", 1).contains("store"));
}
