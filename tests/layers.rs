//! The module layers of `src/` point one way: a module uses only modules of lower layers.
//!
//! The layers, lowest first (also drawn at the top of `docs/architecture.md`):
//!
//! ```text
//! error ← key, settings ← schema ← storage ← format ← text, vector
//!       ← memtable, generation, wal, manifest ← read ← query ← gc ← writer ← compaction
//!       ← db ← bench, ingest, sql, shard ← fuzz
//! ```
//!
//! This test reads every `crate::…` path in `src/` (outside comments; `src/bin/` is the
//! command line, a client of the library) and fails on an edge that does not point down a
//! layer, naming the file, the line and the edge. Below that, files within a module never use
//! each other in a circle, and no function is longer than [`MAX_FUNCTION_LINES`].

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
    ("shard", 13),
    ("ingest", 13),
    ("sql", 14),
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

// ---------------------------------------------------------------------------------------------
// Circles between files.
//
// Within a top-level module, files may use each other, but never in a circle: a file uses
// another when its code names an item there (`crate::a::b::Item`, `super::Item`,
// `self::child::Item`, or `child::Item` for a `mod child;` it declares). A re-export
// (`pub use child::Item;`) is a module's surface, not a use: a `mod.rs` may re-export what its
// children define while they use what it defines.

/// The module path of a file (`src/db/flush.rs` → `["db", "flush"]`, `src/lib.rs` → `[]`).
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).expect("under src/");
    let mut segs: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = segs.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" && stem != "lib" {
            segs.push(stem.to_string());
        }
    }
    segs
}

/// Code without comment lines and without re-export statements.
fn code_without_reexports(text: &str) -> String {
    let code: Vec<String> = code_lines(text).into_iter().map(|(_, l)| l).collect();
    let mut out = String::new();
    let mut in_reexport = false;
    for l in code {
        let t = l.trim_start();
        if !in_reexport && (t.starts_with("pub use ") || t.starts_with("pub(crate) use ")) {
            in_reexport = true;
        }
        if in_reexport {
            if t.trim_end().ends_with(';') {
                in_reexport = false;
            }
            continue;
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// The paths named after `head::` in `code` (groups expanded), each as its segments.
fn paths_after(code: &str, head: &str) -> Vec<(usize, Vec<String>)> {
    let bytes = code.as_bytes();
    let pat = format!("{head}::");
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find(&pat) {
        let start = at + i;
        at = start + pat.len();
        let before = start.checked_sub(1).map(|b| bytes[b]);
        if before.is_some_and(|b| b == b'$' || b == b':' || b.is_ascii_alphanumeric() || b == b'_')
        {
            continue;
        }
        let mut prefix = Vec::new();
        let mut rest = &code[at..];
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1;
                let end = group
                    .char_indices()
                    .find(|(_, c)| {
                        match c {
                            '{' => depth += 1,
                            '}' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .map_or(group.len(), |(j, _)| j);
                for element in split_top_level(&group[..end]) {
                    let mut p = prefix.clone();
                    p.extend(
                        element
                            .split("::")
                            .map(first_segment)
                            .filter(|s| !s.is_empty() && s != "self"),
                    );
                    out.push((start, p));
                }
                break;
            }
            let seg = first_segment(rest);
            if seg.is_empty() {
                out.push((start, prefix));
                break;
            }
            rest = &rest[rest.find(&seg).expect("a segment") + seg.len()..];
            prefix.push(seg);
            match rest.strip_prefix("::") {
                Some(r) => rest = r,
                None => {
                    out.push((start, prefix));
                    break;
                }
            }
        }
    }
    out
}

fn split_top_level(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter().filter(|e| !e.trim().is_empty()).collect()
}

/// How many inline modules (`mod tests { … }`) are open at byte `pos` of `code`.
fn inline_depth(code: &str, pos: usize) -> usize {
    let mut depth = 0;
    let mut at = 0;
    while let Some(i) = code[at..pos].find("mod ") {
        let start = at + i;
        at = start + 4;
        let after = &code[at..pos];
        let name = first_segment(after);
        let tail = after[name.len()..].trim_start();
        if name.is_empty() || !tail.starts_with('{') {
            continue;
        }
        let body = &tail[1..];
        let open = body.matches('{').count() as i64 - body.matches('}').count() as i64;
        if open >= 0 {
            depth += 1;
        }
    }
    depth
}

/// The files each file of `src/` (outside `src/bin/`) uses.
fn file_edges() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let by_module: BTreeMap<Vec<String>, PathBuf> =
        files.iter().map(|f| (module_path(f), f.clone())).collect();
    let resolve = |segs: &[String]| {
        (0..=segs.len())
            .rev()
            .find_map(|n| by_module.get(&segs[..n]).cloned())
    };
    let mut edges = BTreeMap::new();
    for file in &files {
        let me = module_path(file);
        let code = code_without_reexports(&std::fs::read_to_string(file).expect("a source file"));
        let mut out = BTreeSet::new();
        let mut add = |target: Option<PathBuf>| {
            if let Some(t) = target {
                if &t != file && !t.ends_with("lib.rs") {
                    out.insert(t);
                }
            }
        };
        for (_, p) in paths_after(&code, "crate") {
            add(resolve(&p));
        }
        for (pos, p) in paths_after(&code, "super") {
            // `super` inside an inline module is this file.
            let mut base = me.clone();
            if inline_depth(&code, pos) == 0 {
                base.pop();
            }
            let mut p = p.as_slice();
            while let Some(rest) = p.strip_prefix(&["super".to_string()]) {
                base.pop();
                p = rest;
            }
            base.extend(p.iter().cloned());
            add(resolve(&base));
        }
        for (_, p) in paths_after(&code, "self") {
            let mut base = me.clone();
            base.extend(p);
            add(resolve(&base));
        }
        // `child::Item` for a child module this file declares.
        for line in code.lines() {
            let t = line.trim_start();
            let decl = t
                .strip_prefix("pub(crate) mod ")
                .or_else(|| t.strip_prefix("pub mod "))
                .or_else(|| t.strip_prefix("mod "));
            let Some(decl) = decl.filter(|d| d.trim_end().ends_with(';')) else {
                continue;
            };
            let child = first_segment(decl);
            let mut path = me.clone();
            path.push(child.clone());
            if !paths_after(&code, &child).is_empty() {
                add(by_module.get(&path).cloned());
            }
        }
        edges.insert(file.clone(), out);
    }
    edges
}

/// Groups of files that use each other in a circle (strongly connected components of more than
/// one file), each sorted, as paths relative to `src/`.
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<String>> {
    // Kosaraju: order by finish time, then collect on the reversed graph.
    fn visit(
        v: &PathBuf,
        edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        seen: &mut BTreeSet<PathBuf>,
        order: &mut Vec<PathBuf>,
    ) {
        if !seen.insert(v.clone()) {
            return;
        }
        for w in edges.get(v).into_iter().flatten() {
            visit(w, edges, seen, order);
        }
        order.push(v.clone());
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for v in edges.keys() {
        visit(v, edges, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (v, ws) in edges {
        for w in ws {
            reversed.entry(w.clone()).or_default().insert(v.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for v in order.iter().rev() {
        let mut group = Vec::new();
        visit(v, &reversed, &mut assigned, &mut group);
        if group.len() > 1 {
            let mut names: Vec<String> = group
                .iter()
                .map(|f| {
                    f.strip_prefix(src())
                        .expect("under src/")
                        .display()
                        .to_string()
                })
                .collect();
            names.sort();
            out.push(names);
        }
    }
    out.sort();
    out
}

#[test]
fn no_two_files_use_each_other_in_a_circle() {
    let found = circles(&file_edges());
    assert!(
        found.is_empty(),
        "files that use each other in a circle:\n  {}",
        found
            .iter()
            .map(|c| c.join(" → "))
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

#[test]
fn the_circle_checker_sees_a_circle() {
    let a = PathBuf::from("a.rs");
    let b = PathBuf::from("b.rs");
    let c = PathBuf::from("c.rs");
    let root = src();
    let (a, b, c) = (root.join(a), root.join(b), root.join(c));
    let mut edges = BTreeMap::new();
    edges.insert(a.clone(), BTreeSet::from([b.clone()]));
    edges.insert(b.clone(), BTreeSet::from([c.clone()]));
    edges.insert(c.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(circles(&edges), [["a.rs", "b.rs", "c.rs"]]);
    edges.insert(c.clone(), BTreeSet::new());
    assert!(circles(&edges).is_empty());
    // The parser: a group, `super` at file level and inside an inline module, a child.
    let code = "use crate::{db::flush::run, read::Snapshot};\nfn f() { super::g() }\n\
                mod tests { use super::*; }\n";
    let crate_paths: Vec<_> = paths_after(code, "crate")
        .into_iter()
        .map(|p| p.1)
        .collect();
    assert_eq!(
        crate_paths,
        [vec!["db", "flush", "run"], vec!["read", "Snapshot"]]
    );
    let supers: Vec<usize> = paths_after(code, "super")
        .into_iter()
        .map(|(pos, _)| inline_depth(code, pos))
        .collect();
    assert_eq!(supers, [0, 1]);
}

// ---------------------------------------------------------------------------------------------
// Function length.

/// The longest a function of `src/` may be, in lines from `fn` to its closing brace.
const MAX_FUNCTION_LINES: usize = 120;

/// Functions allowed to be longer, with the reason.
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];

/// Every function of `src/` (outside `src/bin/`) longer than `max` lines: (file, name, lines).
fn long_functions(max: usize) -> Vec<(String, String, usize)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(name) = fn_name(line) else {
                continue;
            };
            let Some(len) = body_lines(&lines[i..]) else {
                continue;
            };
            if len > max {
                let rel = file.strip_prefix(src()).expect("under src/");
                out.push((rel.display().to_string(), name, len));
            }
        }
    }
    out
}

/// The name of the function a line declares, if it does.
fn fn_name(line: &str) -> Option<String> {
    let mut t = line.trim_start();
    if t.starts_with("//") {
        return None;
    }
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        t = t.strip_prefix(prefix).unwrap_or(t);
    }
    let name = first_segment(t.strip_prefix("fn ")?);
    (!name.is_empty()).then_some(name)
}

/// Lines from a function's declaration to its closing brace (`None` for a declaration without
/// a body). Strings, characters and line comments are skipped when counting braces.
fn body_lines(lines: &[&str]) -> Option<usize> {
    let mut depth = 0i64;
    let mut opened = false;
    for (n, line) in lines.iter().enumerate() {
        let mut chars = line.chars().peekable();
        let mut in_str = false;
        while let Some(c) = chars.next() {
            match c {
                '\\' if in_str => {
                    chars.next();
                }
                '"' => in_str = !in_str,
                '/' if !in_str && chars.peek() == Some(&'/') => break,
                '\'' if !in_str => {
                    // A character literal ('{', '\n') or a lifetime ('a).
                    let rest: String = chars.clone().take(3).collect();
                    if rest.starts_with('\\') {
                        chars.nth(2);
                    } else if rest.chars().nth(1) == Some('\'') {
                        chars.nth(1);
                    }
                }
                '{' if !in_str => {
                    depth += 1;
                    opened = true;
                }
                '}' if !in_str => depth -= 1,
                ';' if !in_str && !opened => return None,
                _ => {}
            }
        }
        if opened && depth == 0 {
            return Some(n + 1);
        }
    }
    None
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let long: Vec<String> = long_functions(MAX_FUNCTION_LINES)
        .into_iter()
        .filter(|(file, name, _)| {
            !LONG_FUNCTIONS
                .iter()
                .any(|(f, n, _)| f == file && n == name)
        })
        .map(|(file, name, len)| format!("{file}: fn {name}: {len} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "functions longer than {MAX_FUNCTION_LINES} lines (split them, or list them with a \
         reason in LONG_FUNCTIONS):\n  {}",
        long.join("\n  ")
    );
    // Every exception still exists and is still long: the list does not outlive its reasons.
    let all = long_functions(MAX_FUNCTION_LINES);
    for (f, n, _) in LONG_FUNCTIONS {
        assert!(
            all.iter().any(|(file, name, _)| file == f && name == n),
            "{f}: fn {n} is listed in LONG_FUNCTIONS but is no longer long"
        );
    }
}

#[test]
fn the_length_checker_counts_a_body() {
    let code = [
        "fn f() {",
        "    let s = \"}\";",
        "    let c = '{';",
        "    // }",
        "}",
        "x",
    ];
    assert_eq!(fn_name(code[0]).as_deref(), Some("f"));
    assert_eq!(body_lines(&code), Some(5));
    assert_eq!(body_lines(&["fn g();"]), None);
    assert_eq!(
        fn_name("pub(crate) async fn run<'a>(x: &'a str) {").as_deref(),
        Some("run")
    );
}
