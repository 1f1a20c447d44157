//! Persisting a worker's checkpoint directory under the trial directory.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Why a checkpoint could not be persisted.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The reported path does not exist or is not a directory.
    #[error("checkpoint {0} is not a directory")]
    NotADirectory(PathBuf),
    /// The reported path lies outside every directory a worker may
    /// checkpoint from.
    #[error("checkpoint {} is outside the directories a worker may checkpoint from ({})", path.display(), roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", "))]
    Outside {
        /// The path as reported.
        path: PathBuf,
        /// The allowed directories.
        roots: Vec<PathBuf>,
    },
    /// A checkpoint holds regular files and directories only: a symbolic
    /// link (which could lead anywhere), a FIFO or a device is refused.
    #[error("{}", special_file_message(.0, .1))]
    NotAFile(PathBuf, &'static str),
    /// The checkpoint is not below this experiment's storage.
    #[error("checkpoint {0} is not below this experiment's storage")]
    Foreign(String),
    /// A shard a rank says it uploaded itself is not where it must be.
    #[error("checkpoint {0}")]
    NotUploaded(String),
    /// The object store refused or failed a transfer.
    #[error("checkpoint transfer {uri} failed: {source}")]
    Upload {
        /// The object.
        uri: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// Copying failed.
    #[error("failed to persist checkpoint {path}: {source}")]
    Io {
        /// The path being written or read.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl CheckpointError {
    /// Whether the worker's report is at fault (a path that is not a
    /// directory, or not one it may checkpoint from), rather than storage.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            CheckpointError::NotADirectory(_)
                | CheckpointError::NotAFile(..)
                | CheckpointError::Outside { .. }
                | CheckpointError::Foreign(_)
                | CheckpointError::NotUploaded(_)
        )
    }
}

/// `checkpoint_000007` for iteration 7.
pub fn checkpoint_dir_name(iteration: u64) -> String {
    format!("checkpoint_{iteration:06}")
}

/// The shard of `checkpoint` that rank `rank` resumes from: its own, or rank
/// 0's when it saved none (data-parallel code often saves on rank 0 only).
pub fn shard_for(checkpoint: &Path, rank: u32) -> PathBuf {
    let own = checkpoint.join(format!("rank-{rank}"));
    if rank == 0 || own.is_dir() {
        own
    } else {
        checkpoint.join("rank-0")
    }
}

/// Checks a reported checkpoint directory: it must exist, be a directory,
/// and lie (after resolving links) below one of `roots`. Returns its
/// resolved path.
pub fn check_source(src: &Path, roots: &[PathBuf]) -> Result<PathBuf, CheckpointError> {
    let resolved = src.canonicalize().map_err(|_| CheckpointError::NotADirectory(src.to_path_buf()))?;
    if !resolved.is_dir() {
        return Err(CheckpointError::NotADirectory(src.to_path_buf()));
    }
    let inside = roots.iter().filter_map(|r| r.canonicalize().ok()).any(|r| resolved.starts_with(&r));
    if inside || roots.is_empty() {
        Ok(resolved)
    } else {
        Err(CheckpointError::Outside { path: src.to_path_buf(), roots: roots.to_vec() })
    }
}

/// The directories a worker may checkpoint from by default: its trial
/// directory, the temporary directory and the working directory.
pub fn default_roots(trial_dir: &Path, working_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut roots = vec![trial_dir.to_path_buf(), std::env::temp_dir()];
    match working_dir {
        Some(w) => roots.push(w.to_path_buf()),
        None => roots.extend(std::env::current_dir().ok()),
    }
    roots
}

/// [`default_roots`] and `extra`: every directory a run's workers may checkpoint from.
pub(crate) fn roots(trial_dir: &Path, working_dir: Option<&Path>, extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut roots = default_roots(trial_dir, working_dir);
    roots.extend(extra.iter().cloned());
    roots
}

/// Copies `src` to `<trial_dir>/checkpoint_NNNNNN/rank-<rank>/`, synced to
/// disk, and returns the `checkpoint_NNNNNN` directory. The copy is written
/// under a temporary name and renamed into place, so a crash never leaves a
/// partial shard under the final name.
pub fn persist_checkpoint(src: &Path, trial_dir: &Path, iteration: u64, rank: u32) -> Result<PathBuf, CheckpointError> {
    if !src.is_dir() {
        return Err(CheckpointError::NotADirectory(src.to_path_buf()));
    }
    let ckpt = trial_dir.join(checkpoint_dir_name(iteration));
    let tmp = ckpt.join(format!(".rank-{rank}.tmp"));
    let dst = ckpt.join(format!("rank-{rank}"));
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io { path, source }
    };
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    // Refused before anything is made: a shard holding a link or a FIFO leaves no trace.
    check_tree(src)?;
    fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    if let Err(e) = copy_tree(src, &tmp) {
        let _ = fs::remove_dir_all(&tmp);
        // Only when no other rank's shard is in it.
        let _ = fs::remove_dir(&ckpt);
        return Err(e);
    }
    if dst.exists() {
        fs::remove_dir_all(&dst).map_err(io_err(&dst))?;
    }
    fs::rename(&tmp, &dst).map_err(io_err(&dst))?;
    fs::File::open(&ckpt).and_then(|d| d.sync_all()).map_err(io_err(&ckpt))?;
    Ok(ckpt)
}

fn special_file_message(path: &Path, kind: &str) -> String {
    format!(
        "checkpoint file {} is {kind}: a checkpoint holds regular files and directories only (copy what it points to into the checkpoint)",
        path.display()
    )
}

/// What kind of special file `ty` is (`a symbolic link`, ...), or `None`
/// for a regular file or a directory: checkpoints hold only those, so
/// nothing copying one follows a link out of it or blocks on a FIFO.
pub(crate) fn special_kind(ty: fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    match () {
        () if ty.is_dir() || ty.is_file() => None,
        () if ty.is_symlink() => Some("a symbolic link"),
        () if ty.is_fifo() => Some("a FIFO"),
        () if ty.is_socket() => Some("a socket"),
        () => Some("a device or other special file"),
    }
}

/// Refuses every link and special file below `dir` (not following links),
/// naming the first.
pub(crate) fn check_tree(dir: &Path) -> Result<(), CheckpointError> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        let io = |source| CheckpointError::Io { path: at.clone(), source };
        for entry in fs::read_dir(&at).map_err(io)? {
            let entry = entry.map_err(io)?;
            let ty = entry.file_type().map_err(|source| CheckpointError::Io { path: entry.path(), source })?;
            if let Some(kind) = special_kind(ty) {
                return Err(CheckpointError::NotAFile(entry.path(), kind));
            }
            if ty.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(())
}

pub(crate) fn copy_tree(src: &Path, dst: &Path) -> Result<(), CheckpointError> {
    let entries = fs::read_dir(src).map_err(|source| CheckpointError::Io { path: src.to_path_buf(), source })?;
    for entry in entries {
        let entry = entry.map_err(|source| CheckpointError::Io { path: src.to_path_buf(), source })?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let err = |source| CheckpointError::Io { path: from.clone(), source };
        let ty = entry.file_type().map_err(err)?;
        if let Some(kind) = special_kind(ty) {
            return Err(CheckpointError::NotAFile(from, kind));
        }
        if ty.is_dir() {
            fs::create_dir_all(&to).map_err(|source| CheckpointError::Io { path: to.clone(), source })?;
            copy_tree(&from, &to)?;
        } else {
            fs::copy(&from, &to).map_err(|source| CheckpointError::Io { path: from.clone(), source })?;
            fs::File::open(&to).and_then(|f| f.sync_all()).map_err(|source| CheckpointError::Io { path: to.clone(), source })?;
        }
    }
    fs::File::open(dst).and_then(|d| d.sync_all()).map_err(|source| CheckpointError::Io { path: dst.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persists_a_tree_and_refuses_non_directories() {
        let src = tempfile::tempdir().unwrap();
        fs::create_dir_all(src.path().join("sub")).unwrap();
        fs::write(src.path().join("model.bin"), b"weights").unwrap();
        fs::write(src.path().join("sub/opt.bin"), b"state").unwrap();
        let trial = tempfile::tempdir().unwrap();
        let ckpt = persist_checkpoint(src.path(), trial.path(), 7, 0).unwrap();
        assert_eq!(ckpt, trial.path().join("checkpoint_000007"));
        assert_eq!(fs::read(ckpt.join("rank-0/model.bin")).unwrap(), b"weights");
        assert_eq!(fs::read(ckpt.join("rank-0/sub/opt.bin")).unwrap(), b"state");
        assert!(!ckpt.join(".rank-0.tmp").exists());
        let missing = src.path().join("nope");
        assert!(matches!(persist_checkpoint(&missing, trial.path(), 8, 0), Err(CheckpointError::NotADirectory(_))));
        assert!(matches!(persist_checkpoint(&src.path().join("model.bin"), trial.path(), 8, 0), Err(CheckpointError::NotADirectory(_))));
        assert!(!trial.path().join("checkpoint_000008").exists());
    }

    #[test]
    fn a_source_must_lie_below_a_root() {
        let root = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("ck")).unwrap();
        fs::create_dir_all(other.path().join("ck")).unwrap();
        let roots = vec![root.path().to_path_buf()];
        assert!(check_source(&root.path().join("ck"), &roots).is_ok());
        let err = check_source(&other.path().join("ck"), &roots).unwrap_err();
        assert!(matches!(err, CheckpointError::Outside { .. }), "{err}");
        // A link out of a root is judged by where it leads.
        std::os::unix::fs::symlink(other.path().join("ck"), root.path().join("link")).unwrap();
        assert!(matches!(check_source(&root.path().join("link"), &roots), Err(CheckpointError::Outside { .. })));
        assert!(matches!(check_source(&root.path().join("nope"), &roots), Err(CheckpointError::NotADirectory(_))));
    }
}
