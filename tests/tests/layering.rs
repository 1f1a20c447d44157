//! The modules of each library crate form no circle: for every top-level
//! module (a file, or a folder with what is below it), the modules its
//! code names (`crate::x`, `super::x` from a folder's file) are read from
//! the sources, tests left out, and the graph must be acyclic. A circle
//! means two files that cannot be read, tested or moved one without the other.
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

/// Top-level module -> the top-level modules it names.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let top = |p: &Path| -> Option<String> {
        let rel = p.strip_prefix(src).ok()?;
        let first = rel.components().next()?.as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        (first != "lib" && first != "main" && first != "bin").then_some(first)
    };
    let modules: BTreeSet<String> = files.iter().filter_map(|p| top(p)).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let Some(m) = top(f) else { continue };
        let text = std::fs::read_to_string(f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut names = named_after(code, "crate::");
        // In a folder, `super::x` names a sibling; at the top, the crate root.
        if f.parent() != Some(src) {
            names.extend(named_after(code, "super::"));
        }
        let deps = g.entry(m.clone()).or_default();
        deps.extend(names.into_iter().filter(|n| modules.contains(n) && *n != m));
    }
    g
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
        let g = graph(&root.join(krate).join("src"));
        assert!(g.len() > 5, "{krate}: too few modules read ({g:?})");
        if let Some(c) = circle(&g) {
            panic!("{krate}: modules in a circle: {}", c.join(" -> "));
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
}
