//! The files for people: `result.jsonl` / `progress.csv` appended and
//! `params.json` written under each trial's directory, and `status.json`,
//! by a writer thread off the loop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use search::TrialResult;
use trainer::{ResultFiles, ResultLine};

/// A write for the flusher.
#[derive(Debug)]
pub(crate) enum FileWrite {
    /// `params.json` of a new trial.
    Params { trial_dir: PathBuf, config: Value },
    /// The live status of a running sweep, replaced atomically.
    Snapshot { path: PathBuf, json: String },
    /// A file to delete.
    Remove { path: PathBuf },
    /// Lines to append to a file.
    Append { path: PathBuf, text: String },
    /// Bytes to append to a file of a trial's, its directory made if need be.
    AppendBytes { path: PathBuf, bytes: Vec<u8> },
    /// One result line for `result.jsonl` and `progress.csv`.
    Result { trial_dir: std::sync::Arc<Path>, result: std::sync::Arc<TrialResult> },
    /// Results to append to a file as lines of JSON, written out here, off the loop.
    ResultLines { path: PathBuf, results: Vec<std::sync::Arc<TrialResult>> },
}

/// Writer threads: file creation is latency-bound (a disk of the cloud,
/// a network file system), and several threads creating files at once keep
/// up with a thousand short trials a second where one cannot.
const WRITERS: usize = 4;

/// Open trial files kept per writer thread before they are closed.
const OPEN_PER_WRITER: usize = 64;

/// The files for people, written by a few background threads at low
/// priority, so the report path gets the CPU first. A trial's files always
/// go to the same thread, so its lines are written in order; `status.json`
/// and its removal go to the first.
pub(crate) struct FileWriter {
    senders: Vec<std::sync::mpsc::Sender<Vec<FileWrite>>>,
    writers: Vec<std::thread::JoinHandle<()>>,
}

impl FileWriter {
    pub(crate) fn spawn() -> Self {
        let mut senders = Vec::with_capacity(WRITERS);
        let mut writers = Vec::with_capacity(WRITERS);
        for n in 0..WRITERS {
            let (tx, rx) = std::sync::mpsc::channel::<Vec<FileWrite>>();
            let spawned = std::thread::Builder::new().name(format!("nestor-files-{n}")).spawn(move || write_batches(&rx));
            match spawned {
                Ok(handle) => {
                    senders.push(tx);
                    writers.push(handle);
                }
                Err(e) => tracing::error!(error = %e, "cannot start a file writer"),
            }
        }
        Self { senders, writers }
    }

    /// Queues files for the writer threads.
    pub(crate) fn write(&self, files: Vec<FileWrite>) {
        if files.is_empty() || self.senders.is_empty() {
            return;
        }
        let mut shards: Vec<Vec<FileWrite>> = (0..self.senders.len()).map(|_| Vec::new()).collect();
        for f in files {
            let shard = match &f {
                FileWrite::Params { trial_dir, .. } => shard_of(trial_dir, shards.len()),
                FileWrite::Result { trial_dir, .. } => shard_of(trial_dir, shards.len()),
                FileWrite::AppendBytes { path, .. } => shard_of(path.parent().unwrap_or(path), shards.len()),
                FileWrite::Snapshot { .. } | FileWrite::Remove { .. } | FileWrite::Append { .. } | FileWrite::ResultLines { .. } => 0,
            };
            shards[shard].push(f);
        }
        for (tx, batch) in self.senders.iter().zip(shards) {
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
        }
    }

    /// Waits for every queued file write, on this thread.
    pub(crate) fn close_blocking(mut self) {
        self.senders.clear();
        for w in std::mem::take(&mut self.writers) {
            let _ = w.join();
        }
    }

    /// Waits for every queued file write.
    pub(crate) async fn close(mut self) {
        self.senders.clear();
        let writers = std::mem::take(&mut self.writers);
        let _ = tokio::task::spawn_blocking(move || {
            for w in writers {
                let _ = w.join();
            }
        })
        .await;
    }
}

/// Which writer a trial's files go to.
fn shard_of(trial_dir: &Path, writers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    trial_dir.hash(&mut h);
    (h.finish() % writers.max(1) as u64) as usize
}

/// One writer thread: takes batches until the loop closes it.
fn write_batches(rx: &std::sync::mpsc::Receiver<Vec<FileWrite>>) {
    // SAFETY: setpriority on this thread's own id has no other effect.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
    }
    let mut open: HashMap<PathBuf, ResultFiles> = HashMap::new();
    while let Ok(batch) = rx.recv() {
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
        if open.len() > OPEN_PER_WRITER {
            open.clear();
        }
    }
}

pub(crate) use trainer::csv_field;

fn write_file(f: &FileWrite, open: &mut HashMap<PathBuf, ResultFiles>) -> std::io::Result<()> {
    match f {
        FileWrite::Snapshot { path, json } => {
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, json)?;
            std::fs::rename(&tmp, path)
        }
        FileWrite::Append { path, text } => {
            use std::io::Write;
            std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(text.as_bytes())
        }
        FileWrite::ResultLines { path, results } => {
            use std::io::Write;
            let mut text = String::new();
            for r in results {
                text.push_str(&result_line(r).to_json());
                text.push('\n');
            }
            std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(text.as_bytes())
        }
        FileWrite::AppendBytes { path, bytes } => {
            use std::io::Write;
            let open = || std::fs::OpenOptions::new().create(true).append(true).open(path);
            let mut file = match open() {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    std::fs::create_dir_all(path.parent().unwrap_or(path))?;
                    open()?
                }
                other => other?,
            };
            file.write_all(bytes)
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
                // Its first result ever: no file of it can exist yet.
                std::collections::hash_map::Entry::Vacant(e) => e.insert(ResultFiles::open(trial_dir, result.seq == 0)?),
            };
            files.append(&result_line(result))
        }
    }
}

/// A stored result as its line in `result.jsonl` (and the experiment's `results.jsonl`).
pub(crate) fn result_line(result: &TrialResult) -> ResultLine<'_> {
    ResultLine {
        trial_id: &result.trial_id,
        seq: result.seq,
        training_iteration: result.training_iteration,
        metrics: &result.metrics,
        checkpoint: result.checkpoint.as_deref(),
        extra: result.extra.as_ref(),
    }
}

/// The experiment's log of what happened to its trials, one JSON object a line.
pub(crate) const EVENTS: &str = "events.jsonl";

/// Every result of a sweep without per-trial files (`trial_files = false`), a line each.
pub(crate) const RESULTS: &str = "results.jsonl";
