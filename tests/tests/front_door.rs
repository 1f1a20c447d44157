//! The front door, as a new user meets it: the README's sweep in Python,
//! TOML and Rust is the files the suite runs (and they run), its links lead
//! somewhere, and the documentation site builds with warnings as errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::python::{passed, repo, torch_python, torch_venv};
use common::*;

/// The fenced blocks of `lang` in `text`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line == format!("```{lang}") => current = Some(String::new()),
            Some(_) if line == "```" => out.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

#[test]
fn the_readmes_three_sweeps_are_the_example_files() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for (lang, file) in
        [("python", "examples/readme/sweep.py"), ("toml", "examples/readme/sweep.toml"), ("rust", "examples/readme/sweep.rs")]
    {
        let in_readme = blocks(&readme, lang);
        assert_eq!(in_readme.len(), 1, "one {lang} block in the README");
        let on_disk = std::fs::read_to_string(repo().join(file)).unwrap();
        assert_eq!(in_readme[0], on_disk, "the README's {lang} block is not {file}");
    }
}

#[test]
fn the_readmes_links_lead_to_files_that_exist() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut links = 0;
    for part in readme.split("](").skip(1) {
        let target = part.split(')').next().unwrap();
        if target.contains("://") || target.starts_with('#') {
            continue;
        }
        let path = target.split('#').next().unwrap();
        assert!(repo().join(path).exists(), "README links to {target}, which is not in the repository");
        links += 1;
    }
    assert!(links >= 10, "only {links} links checked");
}

/// The best loss a sweep of the README's objective must reach: lr near 0.01, after 20 steps.
fn good_loss(loss: f64) -> bool {
    (0.05..0.06).contains(&loss)
}

#[test]
fn the_readmes_python_sweep_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = passed(torch_python(dir.path(), "examples/readme/sweep.py", &[], &[]));
    // `{'lr': ...} LOSS PATH`
    let last = out.lines().last().unwrap();
    let loss: f64 = last.split("} ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(good_loss(loss), "{out}");
    let runs = std::fs::read_dir(dir.path().join("nestor-runs")).unwrap().count();
    assert_eq!(runs, 1, "one experiment under ./nestor-runs");
}

#[test]
fn the_readmes_toml_sweep_runs_and_its_best_is_one_command_away() {
    let dir = tempfile::tempdir().unwrap();
    let path = format!("{}:{}", torch_venv().join("bin").display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(nestor_bin())
        .args(["run", "examples/readme/sweep.toml", "--plain", "--storage"])
        .arg(dir.path())
        .current_dir(repo())
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let best = ok(nestor(dir.path(), &["best", dir.path().join("readme-sweep").to_str().unwrap(), "--json"]));
    let best: serde_json::Value = serde_json::from_str(&best).unwrap();
    assert!(good_loss(best["metrics"]["loss"].as_f64().unwrap()), "{best}");
}

#[test]
fn the_documentation_site_builds_with_warnings_as_errors() {
    let site = tempfile::tempdir().unwrap();
    let out = Command::new("bash").arg(repo().join("docs/build.sh")).arg(site.path()).output().unwrap();
    assert!(
        out.status.success(),
        "docs/build.sh failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for page in ["index.html", "getting-started/index.html", "experiment-file/index.html", "cli/index.html", "api/index.html"] {
        assert!(site.path().join(page).is_file(), "{page} is missing from the site");
    }
    // The Python API is read from the package's docstrings.
    let api = std::fs::read_to_string(site.path().join("api/index.html")).unwrap();
    assert!(
        api.contains("id=\"nestor.tune.Tuner.fit\"") && api.contains("id=\"nestor.train.ScalingConfig\""),
        "the API page lacks the package's classes"
    );
    assert!(!Path::new(&site.path().join("build.sh")).exists(), "the build script went into the site");
}

/// The pages of the documentation site (docs/*.md).
fn doc_pages() -> Vec<std::path::PathBuf> {
    let mut pages: Vec<std::path::PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    pages
}

#[test]
fn a_docs_block_that_names_an_example_file_is_that_file() {
    let mut checked = 0;
    for page in doc_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for block in blocks(&text, "toml") {
            let Some(name) = block.lines().next().and_then(|l| l.strip_prefix("# ")).filter(|n| n.starts_with("examples/")) else {
                continue;
            };
            let file = std::fs::read_to_string(repo().join(name)).unwrap();
            // The file's settings, from its first table on (its header comment aside).
            let settings = &file[file.find("\n[").map_or(0, |i| i + 1)..];
            assert_eq!(&block[block.find('\n').unwrap() + 1..], settings, "{}: the block is not {name}", page.display());
            checked += 1;
        }
    }
    assert!(checked >= 1, "no docs block names an example file");
}

#[test]
fn every_python_block_of_the_docs_and_the_readme_is_python() {
    let mut pages = doc_pages();
    pages.push(repo().join("README.md"));
    let mut checked = 0;
    for page in pages {
        for block in blocks(&std::fs::read_to_string(&page).unwrap(), "python") {
            let out = Command::new("python3")
                .args(["-c", "import ast, sys; ast.parse(sys.stdin.read())"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut c| {
                    use std::io::Write;
                    c.stdin.take().unwrap().write_all(block.as_bytes())?;
                    c.wait_with_output()
                })
                .unwrap();
            assert!(
                out.status.success(),
                "{}: a python block that does not parse:\n{block}\n{}",
                page.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} python blocks");
}

/// Each crate's features (nestor's own too), as `cargo tree` resolves them for a
/// build of `package` alone, with its dev-dependencies when `dev` (an
/// example's build has them); a crate built twice, for the host and the
/// target, has both sets.
fn features(package: &str, dev: bool, more: &[&str]) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let edges = if dev { "normal,build,dev" } else { "normal,build" };
    let out = Command::new(cargo)
        .args(["tree", "-p", package, "-e", edges, "-f", "{p}|{f}", "--prefix", "none"])
        .args(more)
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    let mut map: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.trim_end_matches(" (*)");
        let Some((id, feats)) = line.split_once('|') else { continue };
        map.entry(id.trim().to_string()).or_default().insert(feats.trim().to_string());
    }
    map
}

/// `pip install ./python` right after the quickstart compiles the binary,
/// nestor-data and Arrow's readers alone (which the quickstart leaves out):
/// every crate both builds use, nestor-trainer and nestor-tuner first, has
/// the same features in each (else it and all above it would be compiled
/// again). workspace-hack/Cargo.toml is where a third-party crate's
/// difference is made up.
#[test]
fn the_wheels_build_reuses_the_quickstarts() {
    let quickstart = features("nestor-examples", true, &[]);
    let wheel = features("nestor-cli", false, &[]);
    assert!(wheel.len() > 100, "cargo tree found too little: {wheel:?}");
    for lib in ["nestor-trainer", "nestor-tuner"] {
        let key = |m: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>| {
            m.keys().find(|k| k.starts_with(&format!("{lib} "))).cloned()
        };
        let (Some(q), Some(w)) = (key(&quickstart), key(&wheel)) else { panic!("{lib} is not in both builds") };
        assert_eq!(quickstart[&q], wheel[&w], "{lib}'s features differ between the quickstart's build and the wheel's");
    }
    let data = features("nestor-data", false, &[]);
    let only_wheel: Vec<&String> = wheel.keys().filter(|k| !quickstart.contains_key(*k)).collect();
    assert!(only_wheel.iter().any(|k| k.starts_with("parquet ")), "the wheel's own crates: {only_wheel:?}");
    let beside_data: Vec<&&String> = only_wheel.iter().filter(|k| !data.contains_key(**k) && !k.starts_with("nestor-cli ")).collect();
    assert!(beside_data.is_empty(), "the wheel builds crates the quickstart does not, beside nestor-data's: {beside_data:?}");
    let differ: Vec<String> = wheel
        .iter()
        .filter(|(k, f)| quickstart.contains_key(*k) && quickstart.get(*k) != Some(f))
        .map(|(k, f)| format!("{k}: the wheel's build {f:?}, the quickstart's {:?}", quickstart.get(k)))
        .collect();
    assert!(differ.is_empty(), "add the quickstart's features to workspace-hack/Cargo.toml:\n{}", differ.join("\n"));
}

/// Every Rust block of the docs is a whole example file (its first line
/// names it), so the workspace's build compiles it and examples/tests runs it.
#[test]
fn every_rust_block_of_the_docs_is_an_example_file_that_builds() {
    let mut checked = 0;
    for page in doc_pages() {
        for block in blocks(&std::fs::read_to_string(&page).unwrap(), "rust") {
            let first = block.lines().next().unwrap_or_default();
            let name = first.strip_prefix("//! ").and_then(|l| l.split(':').next()).filter(|n| n.starts_with("examples/"));
            let name = name.unwrap_or_else(|| panic!("{}: a Rust block that is no example file: {first}", page.display()));
            let file = std::fs::read_to_string(repo().join(name)).unwrap_or_else(|e| panic!("{}: {name}: {e}", page.display()));
            assert_eq!(block, file, "{}: the block is not {name}", page.display());
            let manifest = std::fs::read_to_string(repo().join("examples/Cargo.toml")).unwrap();
            assert!(manifest.contains(&format!("path = \"{}\"", name.trim_start_matches("examples/"))), "{name} is no example target");
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} Rust blocks in the docs");
}
