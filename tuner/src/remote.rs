//! An experiment whose storage is an object store keeps everything there:
//! its checkpoints (written there by the ranks or the driver), its result
//! store (mirrored at every flush: store/mirror.rs), and its files for
//! people and for the driver: `experiment.toml`, `driver/` (what a Python
//! driver wrote: its trainable, settings and hooks), each trial's
//! `result.jsonl`, `progress.csv`, `params.json` and `logs/`. Those files
//! are copied up when the sweep starts (`driver/`) and when it ends or is
//! interrupted (all of them), beside the checkpoints
//! (`<storage>/<experiment>/trials/<id>/...`). [`pull`] brings an
//! experiment back from the bucket alone: files, then the store.

use std::path::{Path, PathBuf};

use trainer::{Storage, StorageError};

/// Whether a file at `rel` (below the experiment's directory) is copied up:
/// not the store (mirrored apart), nor checkpoints (there already), nor
/// what is scratch (restored copies, staged shards, a rank's scratch, rendezvous files).
fn copied(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    if parts.first() == Some(&"store") {
        return false;
    }
    !parts.iter().any(|p| {
        p.starts_with("checkpoint_") || *p == "restore" || *p == ".incoming" || p.starts_with(".scratch") || p.starts_with(".rendezvous")
    }) && !rel.ends_with(".tmp")
}

/// Copies the experiment's files below `under` (`""`: all of them) up to
/// `storage` (the experiment's root there); how many.
pub(crate) async fn push(exp_dir: &Path, storage: &Storage, under: &str) -> Result<usize, StorageError> {
    let mut n = 0;
    for rel in Storage::local(exp_dir).list_below(under).await? {
        let rel = if under.is_empty() { rel } else { format!("{under}/{rel}") };
        if !copied(&rel) {
            continue;
        }
        let path = exp_dir.join(&rel);
        let Ok(bytes) = std::fs::read(&path) else { continue };
        storage.put_bytes(&rel, bytes).await?;
        n += 1;
    }
    Ok(n)
}

/// Why an experiment could not be brought back from its object store.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The object store refused or could not be reached.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// No experiment there.
    #[error("no nestor experiment at {0} (no experiment.toml there)")]
    Missing(String),
    /// Its store could not be read back.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// A local file could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Brings the experiment at `storage` (`s3://bucket/prefix/<name>`) back
/// into `exp_dir`: its files, then its result store (what was there is
/// replaced). Returns its experiment file's text.
pub async fn pull(storage: &Storage, exp_dir: &Path) -> Result<String, PullError> {
    let text = storage.get_bytes("experiment.toml").await?.ok_or_else(|| PullError::Missing(storage.uri("")))?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PullError::Io { path, source }
    };
    for rel in storage.list_below("").await? {
        if !copied(&rel) {
            continue;
        }
        let Some(bytes) = storage.get_bytes(&rel).await? else { continue };
        let path = exp_dir.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, bytes).map_err(io(&path))?;
    }
    crate::store::Store::materialize(&storage.join("store"), &exp_dir.join("store")).await?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_copied_up_is_the_files_for_people_not_the_store_checkpoints_or_scratch() {
        for yes in ["experiment.toml", "trials/t/result.jsonl", "trials/t/logs/rank-0.log", "driver/blob.pkl", "datasets.json"] {
            assert!(copied(yes), "{yes}");
        }
        for no in [
            "store/db",
            "trials/t/checkpoint_000001/rank-0/state.json",
            "trials/t/restore/checkpoint_000001/x",
            "trials/t/.incoming/rank-0-x/y",
            "trials/t/.scratch-rank-0-12/state.json",
            "trials/t/logs/.rendezvous-abc",
            "trials/t/params.json.tmp",
        ] {
            assert!(!copied(no), "{no}");
        }
    }
}
