//! A run's result files for people and other tools: `result.jsonl` (one
//! JSON object per result) and `progress.csv` (one row per result, the
//! columns of the first). Written the same way by a tuner's trials and by a
//! [`crate::Trainer`] run on its own.
//!
//! JSON has no NaN or infinity: non-finite values are written as the
//! strings `"NaN"`, `"Infinity"` and `"-Infinity"` (in the CSV too), the
//! encoding the result store uses.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// One result, as its line in `result.jsonl` reads.
#[derive(Debug, Clone, Copy)]
pub struct ResultLine<'a> {
    /// The trial (or run) that reported.
    pub trial_id: &'a str,
    /// The result's position in the trial's series (0-based).
    pub seq: u64,
    /// Its 1-based iteration.
    pub training_iteration: u64,
    /// Every metric, the automatic ones included.
    pub metrics: &'a BTreeMap<String, f64>,
    /// The checkpoint committed with it.
    pub checkpoint: Option<&'a str>,
    /// Its values that are not numbers (a JSON object), written under `extra`.
    pub extra: Option<&'a serde_json::Value>,
}

/// A value as the result files write it.
fn value_json(v: f64) -> serde_json::Value {
    if v.is_finite() {
        serde_json::json!(v)
    } else if v.is_nan() {
        serde_json::json!("NaN")
    } else if v > 0.0 {
        serde_json::json!("Infinity")
    } else {
        serde_json::json!("-Infinity")
    }
}

fn value_text(v: f64) -> String {
    match value_json(v) {
        serde_json::Value::String(s) => s,
        _ => v.to_string(),
    }
}

/// One CSV field, quoted when it holds a comma, quote or newline.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The fields of one CSV line written by [`csv_field`] (quotes undone).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let (mut quoted, mut chars) = (false, line.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                if let Some(f) = fields.last_mut() {
                    f.push('"');
                }
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => {
                if let Some(f) = fields.last_mut() {
                    f.push(c);
                }
            }
        }
    }
    fields
}

impl ResultLine<'_> {
    /// The line's JSON text (no newline).
    pub fn to_json(&self) -> String {
        let metrics: serde_json::Map<String, serde_json::Value> = self.metrics.iter().map(|(k, v)| (k.clone(), value_json(*v))).collect();
        let mut line = serde_json::json!({
            "trial_id": self.trial_id,
            "seq": self.seq,
            "training_iteration": self.training_iteration,
            "metrics": metrics,
        });
        if let (Some(c), Some(map)) = (self.checkpoint, line.as_object_mut()) {
            map.insert("checkpoint".into(), serde_json::json!(c));
        }
        if let (Some(e), Some(map)) = (self.extra, line.as_object_mut()) {
            map.insert("extra".into(), e.clone());
        }
        line.to_string()
    }
}

/// A run directory's open `result.jsonl` and `progress.csv`.
#[derive(Debug)]
pub struct ResultFiles {
    jsonl: BufWriter<File>,
    csv: BufWriter<File>,
    columns: Option<Vec<String>>,
}

impl ResultFiles {
    /// Opens (creating) the files in `dir` to append. `fresh`: no result of
    /// this run was written before, so there is nothing to read back; a
    /// resumed run keeps the CSV columns its file started with.
    pub fn open(dir: &Path, fresh: bool) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let append = |name: &str| std::fs::OpenOptions::new().create(true).append(true).open(dir.join(name));
        let columns = (!fresh)
            .then(|| std::fs::read_to_string(dir.join("progress.csv")).ok())
            .flatten()
            .and_then(|t| t.lines().next().map(csv_fields));
        Ok(Self { jsonl: BufWriter::new(append("result.jsonl")?), csv: BufWriter::new(append("progress.csv")?), columns })
    }

    /// Appends one result to both files (buffered: [`ResultFiles::flush`]).
    pub fn append(&mut self, r: &ResultLine<'_>) -> std::io::Result<()> {
        writeln!(self.jsonl, "{}", r.to_json())?;
        if self.columns.is_none() {
            let mut c = vec!["trial_id".to_string(), "training_iteration".to_string()];
            c.extend(r.metrics.keys().filter(|k| *k != "training_iteration").cloned());
            writeln!(self.csv, "{}", c.iter().map(|s| csv_field(s)).collect::<Vec<_>>().join(","))?;
            self.columns = Some(c);
        }
        let row: Vec<String> = self
            .columns
            .iter()
            .flatten()
            .map(|c| match c.as_str() {
                "trial_id" => csv_field(r.trial_id),
                "training_iteration" => r.training_iteration.to_string(),
                other => r.metrics.get(other).map(|v| value_text(*v)).unwrap_or_default(),
            })
            .collect();
        writeln!(self.csv, "{}", row.join(","))
    }

    /// Writes what is buffered to the files.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.jsonl.flush()?;
        self.csv.flush()
    }

    /// Writes what is buffered and makes `result.jsonl` durable.
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.flush()?;
        self.jsonl.get_ref().sync_data()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn non_finite_values_and_awkward_names_round_trip_as_text() {
        let dir = tempfile::tempdir().unwrap();
        let metrics: BTreeMap<String, f64> =
            [("loss", f64::NAN), ("up", f64::INFINITY), ("down", f64::NEG_INFINITY), ("a,b", 0.5)].map(|(k, v)| (k.to_string(), v)).into();
        let mut files = ResultFiles::open(dir.path(), true).unwrap();
        let line = ResultLine {
            trial_id: "t1",
            seq: 0,
            training_iteration: 1,
            metrics: &metrics,
            checkpoint: Some("/c/checkpoint_000001"),
            extra: None,
        };
        files.append(&line).unwrap();
        files.sync().unwrap();
        let json: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(dir.path().join("result.jsonl")).unwrap().trim()).unwrap();
        assert_eq!(json["metrics"]["loss"], "NaN");
        assert_eq!(json["metrics"]["up"], "Infinity");
        assert_eq!(json["metrics"]["down"], "-Infinity");
        assert_eq!(json["metrics"]["a,b"], 0.5);
        assert_eq!(json["checkpoint"], "/c/checkpoint_000001");
        assert_eq!(json["seq"], 0);
        let csv = std::fs::read_to_string(dir.path().join("progress.csv")).unwrap();
        assert_eq!(csv, "trial_id,training_iteration,\"a,b\",down,loss,up\nt1,1,0.5,-Infinity,NaN,Infinity\n");
        // A resumed run appends under the columns its file started with.
        drop(files);
        let mut files = ResultFiles::open(dir.path(), false).unwrap();
        let more: BTreeMap<String, f64> = [("loss".to_string(), 1.0), ("new".to_string(), 2.0)].into();
        files.append(&ResultLine { trial_id: "t1", seq: 1, training_iteration: 2, metrics: &more, checkpoint: None, extra: None }).unwrap();
        files.flush().unwrap();
        let csv = std::fs::read_to_string(dir.path().join("progress.csv")).unwrap();
        assert_eq!(csv.lines().last(), Some("t1,2,,,1,"));
        assert_eq!(csv_fields(r#"a,"b,c","d""e",f"#), vec!["a", "b,c", "d\"e", "f"]);
    }
}
