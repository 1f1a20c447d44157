//! Group commit and the files for people: the flusher task makes stored
//! writes durable (one fsync for every burst of results), then answers the
//! waiting workers, then appends `result.jsonl` / `progress.csv` and writes
//! `params.json` under each trial's directory.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use search::TrialResult;
use trainer::Directive;

use crate::store::Store;

/// A write for the flusher.
#[derive(Debug)]
pub(crate) enum FileWrite {
    /// `params.json` of a new trial.
    Params { trial_dir: PathBuf, config: Value },
    /// One result line for `result.jsonl` and `progress.csv`.
    Result { trial_dir: PathBuf, result: TrialResult },
    /// Nothing to write, but the store must be flushed (a trial's end).
    Durable,
}

type Ack = (oneshot::Sender<Directive>, Directive);

struct Job {
    acks: Vec<Ack>,
    files: Vec<FileWrite>,
}

/// Handle on the flusher task.
pub(crate) struct Flusher {
    tx: mpsc::UnboundedSender<Job>,
    task: tokio::task::JoinHandle<()>,
}

impl Flusher {
    pub(crate) fn spawn(store: Store) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        let task = tokio::spawn(async move {
            let mut csv_columns: HashMap<PathBuf, Vec<String>> = HashMap::new();
            while let Some(first) = rx.recv().await {
                let mut acks = first.acks;
                let mut files = first.files;
                while let Ok(more) = rx.try_recv() {
                    acks.extend(more.acks);
                    files.extend(more.files);
                }
                let needs_flush = !acks.is_empty() || files.iter().any(|f| !matches!(f, FileWrite::Params { .. }));
                if needs_flush {
                    if let Err(e) = store.flush_async().await {
                        // Not durable: the workers must not be told their result is safe.
                        tracing::error!(error = %e, "result store flush failed; stopping the reporting trials");
                        for (reply, _) in acks.drain(..) {
                            let _ = reply.send(Directive::Stop);
                        }
                    }
                }
                for (reply, directive) in acks {
                    let _ = reply.send(directive);
                }
                let files_owned = std::mem::take(&mut files);
                let columns = std::mem::take(&mut csv_columns);
                csv_columns = tokio::task::spawn_blocking(move || {
                    let mut columns = columns;
                    for f in files_owned {
                        if let Err(e) = write_file(&f, &mut columns) {
                            tracing::warn!(error = %e, "could not write a trial file");
                        }
                    }
                    columns
                })
                .await
                .unwrap_or_default();
            }
        });
        Self { tx, task }
    }

    pub(crate) fn submit(&self, acks: Vec<Ack>, files: Vec<FileWrite>) {
        if acks.is_empty() && files.is_empty() {
            return;
        }
        if let Err(mpsc::error::SendError(job)) = self.tx.send(Job { acks, files }) {
            for (reply, _) in job.acks {
                let _ = reply.send(Directive::Stop);
            }
        }
    }

    /// Finishes every submitted job.
    pub(crate) async fn close(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

fn append(path: &Path, text: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    f.write_all(text.as_bytes())
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn write_file(f: &FileWrite, columns: &mut HashMap<PathBuf, Vec<String>>) -> std::io::Result<()> {
    match f {
        FileWrite::Durable => Ok(()),
        FileWrite::Params { trial_dir, config } => {
            std::fs::create_dir_all(trial_dir)?;
            let text = serde_json::to_string_pretty(config).unwrap_or_default();
            std::fs::write(trial_dir.join("params.json"), text + "\n")
        }
        FileWrite::Result { trial_dir, result } => {
            std::fs::create_dir_all(trial_dir)?;
            let line = serde_json::to_string(result).unwrap_or_default();
            append(&trial_dir.join("result.jsonl"), &(line + "\n"))?;
            let csv = trial_dir.join("progress.csv");
            let cols = match columns.get(trial_dir) {
                Some(c) => c.clone(),
                None => {
                    let existing = std::fs::read_to_string(&csv).ok().and_then(|t| t.lines().next().map(|h| h.split(',').map(String::from).collect::<Vec<_>>()));
                    let cols = match existing {
                        Some(c) => c,
                        None => {
                            let mut c = vec!["trial_id".to_string(), "training_iteration".to_string()];
                            c.extend(result.metrics.keys().filter(|k| *k != "training_iteration").cloned());
                            append(&csv, &(c.iter().map(|s| csv_field(s)).collect::<Vec<_>>().join(",") + "\n"))?;
                            c
                        }
                    };
                    columns.insert(trial_dir.clone(), cols.clone());
                    cols
                }
            };
            let row: Vec<String> = cols
                .iter()
                .map(|c| match c.as_str() {
                    "trial_id" => csv_field(&result.trial_id),
                    "training_iteration" => result.training_iteration.to_string(),
                    other => result.metrics.get(other).map(|v| v.to_string()).unwrap_or_default(),
                })
                .collect();
            append(&csv, &(row.join(",") + "\n"))
        }
    }
}
