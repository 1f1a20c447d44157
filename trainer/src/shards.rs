//! Checkpoint shards shipped through the report channel, for clusters whose
//! nodes do not share the experiment's directory: a rank streams its shard
//! to the driver (`PutShard`), and fetches the shard it resumes from
//! (`GetShard`). Both sides read and write the same chunk stream with the
//! functions here.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

use crate::proto::ShardChunk;

/// Bytes of file data in one chunk: well under the report channel's
/// largest message.
pub(crate) const CHUNK_BYTES: usize = 256 << 10;

/// `rel` as a path below a shard's directory: relative, `/`-separated, no
/// `.`, `..` or empty parts (a trailing `/` marks a directory).
pub(crate) fn check_relative(rel: &str) -> Result<PathBuf, String> {
    let body = rel.strip_suffix('/').unwrap_or(rel);
    let bad = || format!("shard file name {rel:?} is not a relative path below the shard");
    if body.is_empty() || body.contains('\0') || body.contains('\\') {
        return Err(bad());
    }
    let path = PathBuf::from(body);
    let normal =
        body.split('/').all(|p| !p.is_empty() && p != "." && p != "..") && path.components().all(|c| matches!(c, Component::Normal(_)));
    if normal {
        Ok(path)
    } else {
        Err(bad())
    }
}

/// The files and directories below `dir`, relative to it, `/`-separated,
/// directories with a trailing `/` (only the empty ones are needed, but all
/// are cheap), in a stable order.
fn entries(dir: &Path) -> std::io::Result<Vec<(String, PathBuf, bool)>> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), dir.to_path_buf())];
    while let Some((prefix, at)) = stack.pop() {
        let mut listed: Vec<_> = std::fs::read_dir(&at)?.collect::<Result<_, _>>()?;
        listed.sort_by_key(std::fs::DirEntry::file_name);
        for e in listed {
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            let ty = e.file_type()?;
            if let Some(kind) = crate::checkpoint::special_kind(ty) {
                let why = crate::CheckpointError::NotAFile(e.path(), kind).to_string();
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, why));
            }
            if ty.is_dir() {
                out.push((format!("{name}/"), e.path(), true));
                stack.push((format!("{name}/"), e.path()));
            } else {
                out.push((name, e.path(), false));
            }
        }
    }
    Ok(out)
}

/// Reads `dir` as chunks, handed to `out` in order (`head` fills the
/// sender's fields of the first; an empty directory is that one chunk, with
/// no path). Blocking: run it on a blocking thread. Ends early when `out`
/// returns `false` (the receiver went away).
pub(crate) fn read_chunks(dir: &Path, head: ShardChunk, mut out: impl FnMut(ShardChunk) -> bool) -> std::io::Result<()> {
    let mut head = Some(head);
    let mut send = |path: &str, data: Vec<u8>| -> bool {
        let base = head.take().unwrap_or_default();
        out(ShardChunk { path: path.to_string(), data, ..base })
    };
    let mut sent = false;
    for (rel, path, is_dir) in entries(dir)? {
        if is_dir {
            if !send(&rel, Vec::new()) {
                return Ok(());
            }
            sent = true;
            continue;
        }
        let mut file = std::fs::File::open(&path)?;
        let mut first = true;
        loop {
            let mut buf = vec![0u8; CHUNK_BYTES];
            let mut filled = 0;
            while filled < buf.len() {
                match file.read(&mut buf[filled..])? {
                    0 => break,
                    n => filled += n,
                }
            }
            buf.truncate(filled);
            // An empty file is one empty chunk; a file ends at its first short chunk.
            if filled == 0 && !first {
                break;
            }
            let short = filled < CHUNK_BYTES;
            if !send(&rel, buf) {
                return Ok(());
            }
            (first, sent) = (false, true);
            if short {
                break;
            }
        }
    }
    if !sent {
        send("", Vec::new());
    }
    Ok(())
}

/// Why a chunk was not written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShardError {
    /// The chunk is wrong (a bad name, a file sent twice).
    #[error("{0}")]
    Refused(String),
    /// Writing failed.
    #[error("{0}")]
    Io(String),
}

impl ShardError {
    fn io(path: &Path, e: std::io::Error) -> Self {
        Self::Io(format!("{}: {e}", path.display()))
    }
}

/// Writes a chunk stream below `dir` (created): each chunk's data is
/// appended to its file; a file's chunks must come together.
#[derive(Debug)]
pub(crate) struct ChunkWriter {
    dir: PathBuf,
    current: Option<(String, std::fs::File)>,
    seen: std::collections::HashSet<String>,
    /// Files written.
    pub(crate) files: u32,
    /// Bytes written.
    pub(crate) bytes: u64,
}

impl ChunkWriter {
    pub(crate) fn new(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self { dir: dir.to_path_buf(), current: None, seen: Default::default(), files: 0, bytes: 0 })
    }

    /// Takes one chunk; an error names what is wrong with it (a bad name, a
    /// file sent twice) or the write that failed.
    pub(crate) fn write(&mut self, chunk: &ShardChunk) -> Result<(), ShardError> {
        if chunk.path.is_empty() && chunk.data.is_empty() {
            return Ok(());
        }
        let rel = check_relative(&chunk.path).map_err(ShardError::Refused)?;
        let to = self.dir.join(&rel);
        if chunk.path.ends_with('/') {
            self.current = None;
            return std::fs::create_dir_all(&to).map_err(|e| ShardError::io(&to, e));
        }
        if self.current.as_ref().is_none_or(|(p, _)| *p != chunk.path) {
            if !self.seen.insert(chunk.path.clone()) {
                return Err(ShardError::Refused(format!("shard file {:?} was sent twice (a file's chunks come together)", chunk.path)));
            }
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(|e| ShardError::io(parent, e))?;
            }
            let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&to).map_err(|e| ShardError::io(&to, e))?;
            self.current = Some((chunk.path.clone(), file));
            self.files += 1;
        }
        if let Some((_, file)) = self.current.as_mut() {
            file.write_all(&chunk.data).map_err(|e| ShardError::io(&to, e))?;
        }
        self.bytes += chunk.data.len() as u64;
        Ok(())
    }
}

/// A trial's shipped shards: uploads staged on the driver until a report
/// claims them, and the checkpoint its run resumes from.
#[derive(Debug)]
pub(crate) struct Shipping {
    /// The run's world size.
    pub(crate) world: u32,
    /// Where uploads are staged (`<trial>/.incoming`).
    staging: PathBuf,
    /// The checkpoint the run resumes from, if any.
    restore: Restore,
    /// Upload name -> (rank, staged directory).
    uploads: Mutex<HashMap<String, (u32, PathBuf)>>,
}

/// The checkpoint a run resumes from, as the driver serves it to ranks with `GetShard`.
#[derive(Debug)]
pub(crate) enum Restore {
    /// None: the run starts afresh.
    None,
    /// A copy on the driver's disk.
    Local(PathBuf),
    /// The checkpoint `uri` in the trial's object store, which ranks read
    /// themselves: downloaded below `scratch` the first time a rank that
    /// cannot reach the store asks, once for all of them.
    Store { storage: crate::Storage, uri: String, scratch: PathBuf, local: tokio::sync::OnceCell<PathBuf> },
}

/// Why a rank gets no checkpoint to resume from.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestoreError {
    /// There is none for it: it starts afresh.
    #[error("{0}")]
    Missing(String),
    /// The driver could not download it from the store.
    #[error("{0}")]
    Download(String),
}

impl Restore {
    /// What the run `spec` resumes from.
    pub(crate) fn of(spec: &crate::LaunchSpec) -> Self {
        match (&spec.checkpoint, &spec.checkpoint_uri) {
            (Some(dir), _) => Self::Local(dir.clone()),
            (None, Some(uri)) => Self::Store {
                storage: spec.storage.clone(),
                uri: uri.clone(),
                scratch: spec.trial_dir.join("restore"),
                local: tokio::sync::OnceCell::new(),
            },
            (None, None) => Self::None,
        }
    }

    /// The checkpoint's directory on the driver's disk (downloaded first
    /// where it is in the store); `None` without one.
    async fn local(&self) -> Result<Option<PathBuf>, RestoreError> {
        match self {
            Self::None => Ok(None),
            Self::Local(dir) => Ok(Some(dir.clone())),
            Self::Store { storage, uri, scratch, local } => local
                .get_or_try_init(|| async {
                    tracing::info!(checkpoint = %uri, "a rank cannot reach the object store: the driver downloads the checkpoint it resumes from");
                    storage.fetch_checkpoint(uri, scratch).await.map_err(|e| RestoreError::Download(format!("downloading {uri} on the driver: {e}")))
                })
                .await
                .map(|dir| Some(dir.clone())),
        }
    }
}

impl Shipping {
    pub(crate) fn new(trial_dir: &Path, restore: Restore, world: u32) -> Self {
        Self { world, staging: trial_dir.join(".incoming"), restore, uploads: Mutex::default() }
    }

    /// A fresh staging directory for an upload of `rank`'s, and its name.
    pub(crate) fn stage(&self, rank: u32) -> (String, PathBuf) {
        let name = format!("rank-{rank}-{}", crate::token::random_token().get(..16).unwrap_or_default());
        (name.clone(), self.staging.join(name))
    }

    /// Checks that `dir` is a copy rank `rank` staged itself: directly below
    /// the staging directory and named for that rank.
    pub(crate) fn check_staged(&self, dir: &Path, rank: u32) -> Result<(), String> {
        let named = dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("rank-{rank}-")));
        if dir.parent() != Some(self.staging.as_path()) || !named {
            return Err(format!("a staged checkpoint must be {}/rank-{rank}-<name>, not {}", self.staging.display(), dir.display()));
        }
        // Not followed: a staged link would commit whatever it leads to.
        if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
            return Err(format!("staged checkpoint {} is not a directory", dir.display()));
        }
        crate::checkpoint::check_tree(dir).map_err(|e| e.to_string())
    }

    /// Records a finished upload.
    pub(crate) fn staged(&self, name: String, rank: u32, dir: PathBuf) {
        self.uploads.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(name, (rank, dir));
    }

    /// Takes upload `name` for a report of `rank`'s: its staged directory.
    pub(crate) fn claim(&self, name: &str, rank: u32) -> Result<PathBuf, String> {
        let mut uploads = self.uploads.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match uploads.get(name) {
            None => Err(format!("unknown checkpoint upload {name:?} (uploads are claimed once, by the run that sent them)")),
            Some((owner, _)) if *owner != rank => Err(format!("checkpoint upload {name:?} is rank {owner}'s, not rank {rank}'s")),
            Some(_) => Ok(uploads.remove(name).map(|(_, d)| d).unwrap_or_default()),
        }
    }

    /// The checkpoint the run resumes from, every rank's part of it.
    pub(crate) async fn restore_checkpoint(&self) -> Result<PathBuf, RestoreError> {
        match self.restore.local().await? {
            Some(ckpt) if ckpt.is_dir() => Ok(ckpt),
            Some(ckpt) => Err(RestoreError::Missing(format!("checkpoint {} is gone", ckpt.display()))),
            None => Err(RestoreError::Missing("this run resumes from no checkpoint".into())),
        }
    }

    /// The directory rank `rank` resumes from.
    pub(crate) async fn restore_shard(&self, rank: u32) -> Result<PathBuf, RestoreError> {
        let Some(ckpt) = self.restore.local().await? else {
            return Err(RestoreError::Missing("this run resumes from no checkpoint".into()));
        };
        let shard = crate::checkpoint::shard_for(&ckpt, rank);
        if shard.is_dir() {
            Ok(shard)
        } else {
            Err(RestoreError::Missing(format!("checkpoint {} holds no shard for rank {rank}", ckpt.display())))
        }
    }
}

impl Drop for Shipping {
    fn drop(&mut self) {
        // Copies no report claimed (their rank died first, or staged one
        // itself and died before reporting): nothing refers to them.
        self.uploads.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
        let _ = std::fs::remove_dir_all(&self.staging);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_names_only() {
        for good in ["a", "a/b.bin", "dir/", "x/y/"] {
            assert!(check_relative(good).is_ok(), "{good}");
        }
        for bad in ["", "/", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "a\\b", "a\0"] {
            assert!(check_relative(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tree_goes_through_chunks_whole() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("sub/empty")).unwrap();
        let big: Vec<u8> = (0..(CHUNK_BYTES * 2 + 17)).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.path().join("sub/big.bin"), &big).unwrap();
        std::fs::write(src.path().join("exact.bin"), vec![7u8; CHUNK_BYTES]).unwrap();
        std::fs::write(src.path().join("empty.txt"), b"").unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(2);
        let from = src.path().to_path_buf();
        let head = ShardChunk { trial_id: "t".into(), rank: 3, ..ShardChunk::default() };
        let reader = tokio::task::spawn_blocking(move || read_chunks(&from, head, |c| tx.blocking_send(c).is_ok()));
        let dst = tempfile::tempdir().unwrap();
        let mut w = ChunkWriter::new(&dst.path().join("out")).unwrap();
        let mut first = true;
        while let Some(c) = rx.recv().await {
            assert!(c.data.len() <= CHUNK_BYTES);
            assert_eq!((c.trial_id == "t", c.rank == 3), (first, first), "only the first chunk names the sender");
            first = false;
            w.write(&c).unwrap();
        }
        reader.await.unwrap().unwrap();
        let out = dst.path().join("out");
        assert_eq!(std::fs::read(out.join("sub/big.bin")).unwrap(), big);
        assert_eq!(std::fs::read(out.join("exact.bin")).unwrap(), vec![7u8; CHUNK_BYTES]);
        assert_eq!(std::fs::read(out.join("empty.txt")).unwrap(), b"");
        assert!(out.join("sub/empty").is_dir());
        assert_eq!((w.files, w.bytes), (3, big.len() as u64 + CHUNK_BYTES as u64));
        // A file sent again after another, or a name climbing out, is refused.
        let chunk = |p: &str| ShardChunk { path: p.into(), data: b"x".to_vec(), ..ShardChunk::default() };
        let mut w = ChunkWriter::new(&dst.path().join("again")).unwrap();
        w.write(&chunk("a")).unwrap();
        w.write(&chunk("a")).unwrap();
        w.write(&chunk("b")).unwrap();
        assert!(w.write(&chunk("a")).unwrap_err().to_string().contains("sent twice"));
        assert!(w.write(&chunk("../escape")).unwrap_err().to_string().contains("not a relative path"));
        // An empty directory is one chunk with no path.
        let empty = tempfile::tempdir().unwrap();
        let mut got = Vec::new();
        read_chunks(empty.path(), ShardChunk { rank: 1, ..ShardChunk::default() }, |c| {
            got.push(c);
            true
        })
        .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].rank, got[0].path.as_str()), (1, ""));
        w.write(&got[0]).unwrap();
        assert_eq!(std::fs::read(dst.path().join("again/a")).unwrap(), b"xx");
        assert!(!dst.path().join("escape").exists());
    }
}
