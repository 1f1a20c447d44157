//! The modules of each library crate form no circle: for every top-level
//! module (a file, or a folder with what is below it), the modules its
//! code names (`crate::x`, `super::x` from a folder's file) are read from
//! the sources, test modules left out (the code after them read on), and
//! the graph must be acyclic; so must the files of each folder, among
//! themselves. A name the
//! crate root re-exports (`crate::Tuner`, from `pub use tuner::Tuner` in
//! lib.rs) counts as its module. A circle means two files that cannot be
//! read, tested or moved one without the other. The Python package is held
//! to the same rule (python/checks/import_cycles.py).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Identifiers after `prefix` (`crate::` or `super::`), and the members of a `prefix{a, b}` group.
fn named_after(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    for (i, _) in text.match_indices(prefix) {
        let rest = &text[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(0)];
            out.extend(inner.split(',').map(|m| ident(m.trim())).filter(|m| !m.is_empty()));
        } else {
            out.push(ident(rest));
        }
    }
    out
}

/// The names lib.rs re-exports from the crate's own modules: name -> module
/// (`pub use tuner::{Errored, Tuner};` gives `Tuner -> tuner`).
fn reexports(lib: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in lib.split("pub use ").skip(1) {
        let stmt = &stmt[..stmt.find(';').unwrap_or(stmt.len())];
        let Some((module, rest)) = stmt.split_once("::") else { continue };
        if !modules.contains(module.trim()) {
            continue;
        }
        let items = rest.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            // `a::b::C` re-exports C; `X as Y` names Y.
            let name = item.rsplit(" as ").next().unwrap_or_default().rsplit("::").next().unwrap_or_default().trim();
            if !name.is_empty() {
                out.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    out
}

/// A file's code without its tests and comments: a `#[cfg(test)]` module
/// (`mod tests { ... }`, to its closing brace, or `mod tests;`) goes whole,
/// another `#[cfg(test)]` item its next line; comments (doc links
/// included) make no dependency. What follows a test module is read on.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = rest[at + "#[cfg(test)]".len()..].trim_start();
        rest = if after.starts_with("mod ") {
            match (after.find(';'), after.find('{')) {
                (Some(semi), brace) if brace.is_none_or(|b| semi < b) => &after[semi + 1..],
                (_, Some(open)) => {
                    // To the matching brace (test modules hold no unbalanced braces in strings).
                    let mut depth = 0usize;
                    let end = after[open..]
                        .char_indices()
                        .find_map(|(i, c)| {
                            match c {
                                '{' => depth += 1,
                                '}' => depth -= 1,
                                _ => {}
                            }
                            (depth == 0).then_some(open + i + 1)
                        })
                        .unwrap_or(after.len());
                    &after[end..]
                }
                _ => "",
            }
        } else {
            after.split_once('\n').map_or("", |(_, r)| r)
        };
    }
    out.push_str(rest);
    out.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// Module -> the modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Module -> the modules it names, at two levels: the crate's top-level
/// modules (a folder is one, with what is below it), and, for each folder,
/// its files (`folder::file`, naming each other as `super::x` or
/// `crate::folder::x`).
fn graphs(src: &Path) -> (Graph, BTreeMap<String, Graph>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let parts = |p: &Path| -> Vec<String> {
        p.strip_prefix(src)
            .map(|rel| rel.components().map(|c| c.as_os_str().to_string_lossy().trim_end_matches(".rs").to_string()).collect())
            .unwrap_or_default()
    };
    let top = |p: &Path| -> Option<String> {
        let first = parts(p).into_iter().next()?;
        (first != "lib" && first != "main" && first != "bin").then_some(first)
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|p| top(p)).collect();
    let reexported = reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default(), &modules);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut inner: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for f in &files {
        let Some(m) = top(f) else { continue };
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        let code = code.as_str();
        let mut names = named_after(code, "crate::");
        // In a folder, `super::x` names a sibling; at the top, the crate root.
        let in_folder = f.parent() != Some(src);
        if in_folder {
            names.extend(named_after(code, "super::"));
        }
        let deps = g.entry(m.clone()).or_default();
        let top_names = names.iter().map(|n| reexported.get(n).cloned().unwrap_or_else(|| n.clone()));
        deps.extend(top_names.filter(|n| modules.contains(n) && *n != m));
        // A folder's files, one level down (`mod.rs` is the folder itself).
        let p = parts(f);
        if in_folder && p.len() == 2 {
            let file = p[1].clone();
            let mut siblings = named_after(code, "super::");
            siblings.extend(named_after(code, &format!("crate::{m}::")));
            let folder = inner.entry(m.clone()).or_default();
            let deps = folder.entry(file.clone()).or_default();
            deps.extend(siblings.into_iter().filter(|n| *n != file));
        }
    }
    // Names that are not files of the folder (items of its mod.rs, other crates) make no edge.
    for folder in inner.values_mut() {
        let files: BTreeSet<String> = folder.keys().cloned().collect();
        for deps in folder.values_mut() {
            deps.retain(|d| files.contains(d));
        }
    }
    (g, inner)
}

/// A circle in `g`, if any.
fn circle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(n: &str, g: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut c = path[at..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

#[test]
fn no_library_crate_has_a_circle_of_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    for krate in ["search", "schedulers", "trainer", "tuner"] {
        let (g, folders) = graphs(&root.join(krate).join("src"));
        assert!(g.len() > 5, "{krate}: too few modules read ({g:?})");
        if let Some(c) = circle(&g) {
            panic!("{krate}: modules in a circle: {}", c.join(" -> "));
        }
        for (folder, files) in &folders {
            if let Some(c) = circle(files) {
                panic!("{krate}: the files of {folder}/ in a circle: {}", c.join(" -> "));
            }
        }
    }
}

#[test]
fn a_circle_is_found() {
    let g: BTreeMap<String, BTreeSet<String>> = [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec!["a"])]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.into_iter().map(str::to_string).collect()))
        .collect();
    assert_eq!(circle(&g).unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(named_after("use crate::{x, y::z};\ncrate::w::f()", "crate::"), ["x", "y", "w"]);
    // Test modules go, inline or not; what follows them is read; a gated item goes with its line.
    let code = code_of("use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n    fn f() { if x { crate::c(); } }\n}\nuse crate::d;\n#[cfg(test)]\nuse crate::e;\n#[cfg(test)] mod more;\n// crate::f\nuse crate::g;");
    assert_eq!(named_after(&code, "crate::"), ["a", "d", "g"]);
    let modules: BTreeSet<String> = ["tuner", "config"].into_iter().map(str::to_string).collect();
    let r = reexports("pub use tuner::{Errored, Tuner};\npub use config::{\n    a::B as C,\n    D,\n};\npub use search::Space;", &modules);
    assert_eq!(r.get("Tuner").map(String::as_str), Some("tuner"));
    assert_eq!(r.get("C").map(String::as_str), Some("config"));
    assert_eq!(r.get("D").map(String::as_str), Some("config"));
    assert!(!r.contains_key("Space"), "another crate's names are not the crate's modules");
}

#[test]
fn the_python_package_has_no_circle_of_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = std::process::Command::new("python3").arg(root.join("python/checks/import_cycles.py")).output().expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the nestor package's modules import each other in a circle:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" 0 circles"), "{stdout}");
}
