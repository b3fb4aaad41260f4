//! The module layers of `src/` point one way: a module uses only modules of lower layers.
//!
//! The layers, lowest first (also drawn at the top of `docs/architecture.md`):
//!
//! ```text
//! error ← key, settings ← schema ← storage ← format ← text, vector
//!       ← memtable, generation, wal, manifest ← read ← query ← gc ← writer ← compaction
//!       ← db ← bench, ingest ← fuzz
//! ```
//!
//! This test reads every `crate::…` path in `src/` (outside comments; `src/bin/` is the
//! command line, a client of the library) and fails on an edge that does not point down a
//! layer, naming the file, the line and the edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and its layer.
const LAYERS: &[(&str, u32)] = &[
    ("error", 0),
    ("key", 1),
    ("flags", 1),
    ("settings", 1),
    ("priority", 1),
    ("schema", 2),
    ("storage", 3),
    ("format", 4),
    ("text", 5),
    ("vector", 5),
    ("memtable", 6),
    ("generation", 6),
    ("wal", 6),
    ("manifest", 6),
    ("read", 7),
    ("query", 8),
    ("gc", 9),
    ("writer", 10),
    ("compaction", 11),
    ("db", 12),
    ("bench", 13),
    ("ingest", 13),
    ("fuzz", 14),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src/ is readable") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`None` for `lib.rs`).
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).expect("under src/");
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    if first == "lib.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_string())
}

/// Code without comment lines (doc links name paths without depending on them).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect()
}

/// The first segment of every path after `crate::` in `code`, with the line it is on.
fn crate_paths(code: &[(usize, String)]) -> Vec<(usize, String)> {
    // Join lines so that `use crate::{\n a,\n b };` is one piece; remember line starts.
    let mut text = String::new();
    let mut starts = Vec::new();
    for (n, l) in code {
        starts.push((text.len(), *n));
        text.push_str(l);
        text.push('\n');
    }
    let line_at = |pos: usize| {
        starts
            .iter()
            .rev()
            .find(|(s, _)| *s <= pos)
            .map_or(0, |(_, n)| *n)
    };
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find("crate::") {
        let start = at + i;
        at = start + "crate::".len();
        // `pub(crate)` and `$crate` are not paths into the crate.
        if start > 0 && (bytes[start - 1] == b'$' || bytes[start - 1].is_ascii_alphanumeric()) {
            continue;
        }
        if bytes.get(at) == Some(&b'{') {
            // A group: split at top-level commas, take each element's first segment.
            let mut depth = 0;
            let mut element = String::new();
            for (j, c) in text[at..].char_indices() {
                match c {
                    '{' => {
                        depth += 1;
                        if depth > 1 {
                            element.push(c);
                        }
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            out.push((line_at(at + j), first_segment(&element)));
                            break;
                        }
                        element.push(c);
                    }
                    ',' if depth == 1 => {
                        out.push((line_at(at + j), first_segment(&element)));
                        element.clear();
                    }
                    _ => element.push(c),
                }
            }
        } else {
            out.push((line_at(start), first_segment(&text[at..])));
        }
    }
    out.retain(|(_, s)| !s.is_empty());
    out
}

fn first_segment(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Names `lib.rs` re-exports at the crate root, and the module each comes from.
fn root_names() -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    let mut out = BTreeMap::new();
    let code = code_lines(&lib)
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n");
    for stmt in code.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let (module, items) = match rest.split_once("::") {
            Some(m) => m,
            None => continue,
        };
        let items = items.trim();
        let names: Vec<&str> = match items.strip_prefix('{') {
            Some(g) => g.trim_end_matches('}').split(',').collect(),
            None => vec![items],
        };
        for n in names {
            let n = n.trim();
            let leaf = n.rsplit("::").next().unwrap_or(n).trim();
            if !leaf.is_empty() {
                out.insert(leaf.to_string(), module.trim().to_string());
            }
        }
    }
    out
}

/// The upward or sideways edges found in `files`: `file:line: from -> to`.
fn violations(files: &[PathBuf]) -> Vec<String> {
    let layers: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let roots = root_names();
    let mut bad = Vec::new();
    for file in files {
        let Some(from) = module_of(file) else {
            continue;
        };
        let Some(&from_layer) = layers.get(from.as_str()) else {
            bad.push(format!(
                "{}: module '{from}' has no layer in tests/layers.rs",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a source file");
        for (line, seg) in crate_paths(&code_lines(&text)) {
            let to = if layers.contains_key(seg.as_str()) {
                seg.clone()
            } else if let Some(m) = roots.get(&seg) {
                m.clone()
            } else {
                bad.push(format!(
                    "{}:{line}: crate::{seg} is neither a module nor a name lib.rs re-exports",
                    file.display()
                ));
                continue;
            };
            let to_layer = layers[to.as_str()];
            if to != from && to_layer >= from_layer {
                bad.push(format!(
                    "{}:{line}: {from} (layer {from_layer}) uses {to} (layer {to_layer}) through crate::{seg}",
                    file.display()
                ));
            }
        }
    }
    bad
}

#[test]
fn every_use_points_down_a_layer() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    assert!(files.len() > 20, "found the sources: {files:?}");
    let bad = violations(&files);
    assert!(
        bad.is_empty(),
        "edges against the layering:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn every_module_has_a_layer_and_is_declared() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let found: BTreeSet<String> = files.iter().filter_map(|f| module_of(f)).collect();
    let layered: BTreeSet<String> = LAYERS.iter().map(|(m, _)| m.to_string()).collect();
    assert_eq!(found, layered, "modules in src/ against the layer table");
}

#[test]
fn the_checker_sees_an_upward_edge() {
    // The checker itself: a storage file that reaches into the query layer, in a group, in a
    // plain path, and through a root re-export, is reported three times; comments are not.
    let code = "use crate::{error::Error, query::SearchOptions};\n\
                // crate::db::Index in a comment\n\
                fn f() -> crate::read::Snapshot { todo!() }\n\
                fn g(_: crate::Index) {}\n";
    let paths = crate_paths(&code_lines(code));
    let segs: Vec<&str> = paths.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(segs, ["error", "query", "read", "Index"]);
    // Check the parsed edges against the table as `violations` does for a storage file.
    let layers: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let roots = root_names();
    let up: Vec<&str> = segs
        .iter()
        .map(|s| {
            if layers.contains_key(s) {
                *s
            } else {
                roots[*s].as_str()
            }
        })
        .filter(|m| layers[m] >= layers["storage"])
        .collect();
    assert_eq!(up, ["query", "read", "db"]);
}
