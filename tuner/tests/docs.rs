//! The reference pages against the code they describe, so they cannot
//! drift: the experiment file's keys (docs/experiment-file.md) against the
//! parser, the command line (docs/cli.md) against the binary's help, and
//! every TOML block of the docs and the README against the parser.
//!
//! The accepted keys are read from the parser itself: each table is given a
//! key it cannot know, and its refusal lists the keys it expects.
//! `NESTOR_BLESS=1` rewrites the generated part of docs/cli.md.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use tuner::ExperimentFile;

/// A file that parses, with `extra` added (tables after the base's).
fn base(extra: &str) -> String {
    format!("[experiment]\nname = \"p\"\nmetric = \"loss\"\nmode = \"min\"\n\n[space]\nx = {{ uniform = [0, 1] }}\n\n{extra}\n")
}

/// The keys the table `header` (with `lines` in it) accepts, from the
/// parser's refusal of a key it cannot know.
fn accepted(header: &str, lines: &str) -> BTreeSet<String> {
    let text = if header.is_empty() {
        format!("__probe__ = 1\n{}", base(""))
    } else if header == "[experiment]" {
        base("").replacen("[experiment]\n", "[experiment]\n__probe__ = 1\n", 1)
    } else {
        base(&format!("{header}\n{lines}__probe__ = 1\n"))
    };
    let err = ExperimentFile::from_toml(&text, "probe.toml", &[]).expect_err("a key it cannot know").to_string();
    // serde: "expected one of `a`, `b`, `c`", "expected `a` or `b`", "expected `a`".
    let (_, expected) = err.split_once("expected ").unwrap_or_else(|| panic!("{header}: no list of keys in: {err}"));
    expected.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// Every table the parser reads, with the keys each accepts: `[name]`, or
/// `[name] type = "t"` for a table whose keys follow its `type`.
fn tables() -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    out.insert("top level".to_string(), accepted("", ""));
    for table in ["experiment", "search", "checkpoint", "failure", "cluster", "python"] {
        out.insert(format!("[{table}]"), accepted(&format!("[{table}]"), ""));
    }
    out.insert("[trainer]".into(), accepted("[trainer]", "command = [\"true\"]\n"));
    out.insert("[cluster.jobs]".into(), accepted("[cluster.jobs]", ""));
    // A data set's table form (the section's own keys are the data sets' names).
    out.insert("[datasets]".into(), accepted("[datasets.train]", "path = \"x\"\n"));
    for t in ["asha", "hyperband", "hyperband_bohb", "median_stopping", "learning_curve", "pbt", "pb2", "resource_changing"] {
        let mut keys = accepted("[scheduler]", &format!("type = \"{t}\"\n"));
        keys.insert("type".into());
        out.insert(format!("[scheduler] type = \"{t}\""), keys);
    }
    for t in ["tensorboard", "mlflow", "wandb"] {
        let mut keys = accepted("[[callbacks]]", &format!("type = \"{t}\"\n"));
        keys.insert("type".into());
        out.insert(format!("[[callbacks]] type = \"{t}\""), keys);
    }
    out
}

/// The keys docs/experiment-file.md documents, by table, as [`tables`] names them.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/experiment-file.md")).unwrap();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut table: Option<String> = None;
    let mut fenced = false;
    for line in page.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        if let Some(h) = line.strip_prefix("## ").or_else(|| line.strip_prefix("### ")) {
            table = Some(if h == "Sections" { "top level".to_string() } else { h.trim().to_string() });
            continue;
        }
        let Some(t) = &table else { continue };
        if let Some(key) = line.strip_prefix("| `").and_then(|r| r.split('`').next()) {
            out.entry(t.clone()).or_default().insert(key.to_string());
        }
    }
    out
}

#[test]
fn every_key_the_parser_accepts_is_documented_and_every_documented_key_is_accepted() {
    let (parsed, documented) = (tables(), documented());
    let mut wrong = Vec::new();
    for (table, keys) in &parsed {
        let doc = documented.get(table).cloned().unwrap_or_default();
        let missing: Vec<&String> = keys.difference(&doc).collect();
        let extra: Vec<&String> = doc.difference(keys).collect();
        if !missing.is_empty() {
            wrong.push(format!("{table}: accepted but not documented: {missing:?}"));
        }
        if !extra.is_empty() {
            wrong.push(format!("{table}: documented but refused: {extra:?}"));
        }
    }
    for table in documented.keys().filter(|t| !parsed.contains_key(*t)) {
        wrong.push(format!("{table}: a table of keys the parser does not have"));
    }
    assert!(wrong.is_empty(), "docs/experiment-file.md and the parser differ:\n{}", wrong.join("\n"));
    // The probe itself works: the tables hold what they must.
    assert!(parsed["[experiment]"].contains("num_samples") && parsed["top level"].contains("scheduler"), "{parsed:?}");
}

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

const GENERATED: &str = "<!-- Generated from the binary's help by tuner/tests/docs.rs (NESTOR_BLESS=1 rewrites it). -->";

/// Every subcommand's `--help`, as markdown.
fn cli_reference() -> String {
    use clap::CommandFactory;
    let mut cmd = tuner::cli::Cli::command();
    let mut out = format!("{GENERATED}\n\n```text\n{}\n```\n", cmd.render_long_help().to_string().trim_end());
    for sub in cmd.get_subcommands_mut().filter(|s| !s.is_hide_set()) {
        let name = sub.get_name().to_string();
        let help = sub.render_long_help().to_string();
        out.push_str(&format!("\n### nestor {name}\n\n```text\n{}\n```\n", help.trim_end()));
    }
    out
}

#[test]
fn the_command_line_page_is_the_binarys_help() {
    let path = repo().join("docs/cli.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let (head, generated) = page.split_once(GENERATED).expect("docs/cli.md has its generated part");
    let want = cli_reference();
    if std::env::var_os("NESTOR_BLESS").is_some() {
        std::fs::write(&path, format!("{head}{want}")).unwrap();
        return;
    }
    assert!(
        format!("{GENERATED}{generated}") == want,
        "docs/cli.md is not the binary's help: run NESTOR_BLESS=1 cargo test -p nestor-tuner --test docs"
    );
    assert!(want.contains("### nestor run") && want.contains("--set"), "{want}");
}

/// The TOML blocks of `text`, with the line each starts on.
fn toml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        match &mut current {
            None if line.trim_start() == "```toml" => current = Some((n + 1, String::new())),
            Some(_) if line.trim_start().starts_with("```") => out.extend(current.take()),
            Some((_, block)) => {
                block.push_str(line.trim_start());
                block.push('\n');
            }
            None => {}
        }
    }
    out
}

#[test]
fn every_toml_block_of_the_docs_and_the_readme_parses() {
    let mut pages: Vec<std::path::PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.push(repo().join("README.md"));
    let mut checked = 0;
    let mut wrong = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (line, block) in toml_blocks(&text) {
            let origin = format!("{}:{line}", page.strip_prefix(repo()).unwrap().display());
            // A whole file is resolved (every rule across sections); a fragment is
            // parsed into a file of its own (keys, types and values of its tables).
            let result = if block.lines().any(|l| l.trim() == "[experiment]") {
                // An [experiment] without a name is part of a file: it gets one.
                let block = if block.contains("\nname = ") {
                    block.clone()
                } else {
                    block.replacen("[experiment]\n", "[experiment]\nname = \"p\"\n", 1)
                };
                ExperimentFile::from_toml(&block, &origin, &[]).and_then(|f| f.resolve(&origin)).map(drop)
            } else {
                let mut text = base("");
                if block.lines().any(|l| l.trim() == "[space]") {
                    text = text.replace("[space]\nx = { uniform = [0, 1] }\n", "");
                }
                text.push_str(&block);
                ExperimentFile::from_toml(&text, &origin, &[]).map(drop)
            };
            if let Err(e) = result {
                wrong.push(e.to_string());
            }
            checked += 1;
        }
    }
    assert!(wrong.is_empty(), "TOML blocks the parser refuses:\n{}", wrong.join("\n"));
    assert!(checked >= 15, "only {checked} TOML blocks found");
}
