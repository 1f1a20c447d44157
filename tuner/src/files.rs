//! The files for people: `result.jsonl` / `progress.csv` appended and
//! `params.json` written under each trial's directory, and `status.json`,
//! by a writer thread off the loop.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use search::TrialResult;

/// A write for the flusher.
#[derive(Debug)]
pub(crate) enum FileWrite {
    /// `params.json` of a new trial.
    Params { trial_dir: PathBuf, config: Value },
    /// The live status of a running sweep, replaced atomically.
    Snapshot { path: PathBuf, json: String },
    /// A file to delete.
    Remove { path: PathBuf },
    /// One result line for `result.jsonl` and `progress.csv`.
    Result { trial_dir: std::sync::Arc<Path>, result: std::sync::Arc<TrialResult> },
}

/// The files for people, written by a background thread at low priority so
/// the report path gets the CPU first.
pub(crate) struct FileWriter {
    file_tx: Option<std::sync::mpsc::Sender<Vec<FileWrite>>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl FileWriter {
    pub(crate) fn spawn() -> Self {
        let (file_tx, file_rx) = std::sync::mpsc::channel::<Vec<FileWrite>>();
        let writer = std::thread::Builder::new()
            .name("nestor-files".into())
            .spawn(move || {
                // SAFETY: setpriority on this thread's own id has no other effect.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
                }
                let mut open: HashMap<PathBuf, TrialFiles> = HashMap::new();
                while let Ok(batch) = file_rx.recv() {
                    for f in batch {
                        if let Err(e) = write_file(&f, &mut open) {
                            tracing::warn!(error = %e, "could not write a trial file");
                        }
                    }
                    // Each batch reaches the files before the next is taken; handles stay open for the next.
                    for files in open.values_mut() {
                        if let Err(e) = files.flush() {
                            tracing::warn!(error = %e, "could not write a trial file");
                        }
                    }
                    if open.len() > 256 {
                        open.clear();
                    }
                }
            })
            .map_err(|e| tracing::error!(error = %e, "cannot start the file writer"))
            .ok();
        Self { file_tx: Some(file_tx), writer }
    }

    /// Queues files for the writer thread.
    pub(crate) fn write(&self, files: Vec<FileWrite>) {
        if let (false, Some(tx)) = (files.is_empty(), &self.file_tx) {
            let _ = tx.send(files);
        }
    }

    /// Waits for every queued file write.
    pub(crate) async fn close(mut self) {
        self.file_tx = None;
        if let Some(w) = self.writer.take() {
            let _ = tokio::task::spawn_blocking(move || w.join()).await;
        }
    }
}

/// One CSV field, quoted when it holds a comma, quote or newline.
pub(crate) fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A trial's open `result.jsonl` and `progress.csv`, and the CSV's columns.
struct TrialFiles {
    jsonl: std::io::BufWriter<std::fs::File>,
    csv: std::io::BufWriter<std::fs::File>,
    columns: Option<Vec<String>>,
}

impl TrialFiles {
    fn open(trial_dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(trial_dir)?;
        let append = |name: &str| std::fs::OpenOptions::new().create(true).append(true).open(trial_dir.join(name));
        // A resumed trial keeps the columns its file started with.
        let columns = std::fs::read_to_string(trial_dir.join("progress.csv"))
            .ok()
            .and_then(|t| t.lines().next().map(|h| h.split(',').map(String::from).collect::<Vec<_>>()));
        Ok(Self { jsonl: std::io::BufWriter::new(append("result.jsonl")?), csv: std::io::BufWriter::new(append("progress.csv")?), columns })
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.jsonl.flush()?;
        self.csv.flush()
    }
}

fn write_file(f: &FileWrite, open: &mut HashMap<PathBuf, TrialFiles>) -> std::io::Result<()> {
    match f {
        FileWrite::Snapshot { path, json } => {
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, json)?;
            std::fs::rename(&tmp, path)
        }
        FileWrite::Remove { path } => match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        },
        FileWrite::Params { trial_dir, config } => {
            std::fs::create_dir_all(trial_dir)?;
            let text = serde_json::to_string_pretty(config).unwrap_or_default();
            std::fs::write(trial_dir.join("params.json"), text + "\n")
        }
        FileWrite::Result { trial_dir, result } => {
            let files = match open.entry(trial_dir.to_path_buf()) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(TrialFiles::open(trial_dir)?),
            };
            serde_json::to_writer(&mut files.jsonl, &**result)?;
            files.jsonl.write_all(b"\n")?;
            if files.columns.is_none() {
                let mut c = vec!["trial_id".to_string(), "training_iteration".to_string()];
                c.extend(result.metrics.keys().filter(|k| *k != "training_iteration").cloned());
                writeln!(files.csv, "{}", c.iter().map(|s| csv_field(s)).collect::<Vec<_>>().join(","))?;
                files.columns = Some(c);
            }
            let row: Vec<String> = files
                .columns
                .iter()
                .flatten()
                .map(|c| match c.as_str() {
                    "trial_id" => csv_field(&result.trial_id),
                    "training_iteration" => result.training_iteration.to_string(),
                    other => result.metrics.get(other).map(|v| v.to_string()).unwrap_or_default(),
                })
                .collect();
            writeln!(files.csv, "{}", row.join(","))
        }
    }
}
