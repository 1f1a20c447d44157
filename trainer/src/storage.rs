//! Where checkpoints live: a local directory, or an object store (`s3://`,
//! `gs://`, `az://`) through `object_store`, configured the usual way (the
//! provider's environment variables, e.g. `AWS_ACCESS_KEY_ID`,
//! `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`).
//!
//! A checkpoint is `<location>/checkpoint_NNNNNN/rank-<r>/...`, one shard per
//! rank that saved one. Shards are uploaded as ranks report; the checkpoint
//! exists for nestor only once its record is committed in the result store,
//! so a half-uploaded checkpoint is never restored. A `.committed` marker is
//! written beside the shards after the commit, for other tools.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use tokio::io::AsyncReadExt;

use crate::checkpoint::{checkpoint_dir_name, copy_tree, persist_checkpoint, CheckpointError};

/// Files above this size are uploaded in parts, several at a time.
const MULTIPART_THRESHOLD: u64 = 16 << 20;
const PART_SIZE: usize = 16 << 20;
const PARTS_IN_FLIGHT: usize = 8;
/// Files of one shard uploaded or downloaded at once.
const FILES_IN_FLIGHT: usize = 8;
/// The marker written beside a committed checkpoint's shards.
pub const COMMITTED_MARKER: &str = ".committed";

/// Why a storage location cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The location is not a path nor a URL object_store knows.
    #[error("storage `{location}`: {reason}")]
    Invalid {
        /// The location as given.
        location: String,
        /// Why.
        reason: String,
    },
    /// The store refused or could not be reached.
    #[error("storage `{location}` is not usable: {source}")]
    Unreachable {
        /// The location.
        location: String,
        /// Why.
        #[source]
        source: object_store::Error,
    },
    /// A local operation failed.
    #[error("storage `{}`: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug)]
enum Kind {
    Local(PathBuf),
    Object { store: Arc<dyn ObjectStore>, base: String, prefix: ObjPath },
}

/// A storage location: a local directory or a prefix in an object store.
/// Cheap to clone; `join` descends into it.
#[derive(Debug, Clone)]
pub struct Storage {
    kind: Arc<Kind>,
    /// Below the root (object stores only; local paths are joined directly).
    sub: Option<ObjPath>,
}

impl Storage {
    /// A local directory.
    pub fn local(dir: impl Into<PathBuf>) -> Self {
        Self { kind: Arc::new(Kind::Local(dir.into())), sub: None }
    }

    /// `s3://bucket/prefix`, `gs://...`, `az://...` (or `abfss://`,
    /// `file:///abs/path`), or a plain local path. Credentials and endpoints
    /// come from the environment, as the provider's tools read them.
    pub fn parse(location: &str) -> Result<Self, StorageError> {
        let invalid = |reason: String| StorageError::Invalid { location: location.to_string(), reason };
        let Some((scheme, rest)) = location.split_once("://") else {
            return Ok(Self::local(location));
        };
        if scheme == "file" {
            return Ok(Self::local(rest));
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("no bucket or container in the URL".into()));
        }
        let base = format!("{scheme}://{bucket}");
        let store = cloud_store(scheme, &base).map_err(invalid)?;
        let prefix = ObjPath::parse(prefix.trim_matches('/')).map_err(|e| invalid(e.to_string()))?;
        Ok(Self { kind: Arc::new(Kind::Object { store, base, prefix }), sub: None })
    }

    /// The location `rel` below this one (`/`-separated segments).
    pub fn join(&self, rel: &str) -> Self {
        match &*self.kind {
            Kind::Local(dir) => Self::local(dir.join(rel)),
            Kind::Object { .. } => {
                let mut p = self.sub.clone().unwrap_or_default();
                for seg in rel.split('/').filter(|s| !s.is_empty()) {
                    p = p.join(seg);
                }
                Self { kind: Arc::clone(&self.kind), sub: Some(p) }
            }
        }
    }

    /// Whether this is a local directory.
    pub fn is_local(&self) -> bool {
        matches!(&*self.kind, Kind::Local(_))
    }

    fn object_path(&self, rel: &str) -> ObjPath {
        let Kind::Object { prefix, .. } = &*self.kind else { return ObjPath::from(rel) };
        let mut p = prefix.clone();
        for seg in self.sub.iter().flat_map(|s| s.parts()) {
            p = p.join(seg);
        }
        for seg in rel.split('/').filter(|s| !s.is_empty()) {
            p = p.join(seg);
        }
        p
    }

    /// The location of `rel` below this one, as a path or URL people and
    /// tools understand (`/abs/dir/rel`, `s3://bucket/prefix/rel`).
    pub fn uri(&self, rel: &str) -> String {
        match &*self.kind {
            Kind::Local(dir) => {
                if rel.is_empty() {
                    dir.display().to_string()
                } else {
                    dir.join(rel).display().to_string()
                }
            }
            Kind::Object { base, .. } => {
                let p = self.object_path(rel);
                if p.as_ref().is_empty() {
                    base.clone()
                } else {
                    format!("{base}/{p}")
                }
            }
        }
    }

    /// The objects of the checkpoint at `rel` (below this location), each
    /// with its path inside the checkpoint; the commit marker left out.
    async fn checkpoint_files(
        &self,
        store: &Arc<dyn ObjectStore>,
        rel: &str,
        uri: &str,
    ) -> Result<Vec<(object_store::ObjectMeta, Vec<String>)>, CheckpointError> {
        let prefix = self.object_path(rel);
        let listed: Vec<object_store::ObjectMeta> =
            store.list(Some(&prefix)).try_collect().await.map_err(|source| CheckpointError::Upload { uri: uri.to_string(), source })?;
        let skip = prefix.parts().count();
        Ok(listed
            .into_iter()
            .filter_map(|meta| {
                let parts: Vec<String> = meta.location.parts().skip(skip).map(|p| p.as_ref().to_string()).collect();
                (!parts.is_empty() && parts[0] != COMMITTED_MARKER).then_some((meta, parts))
            })
            .collect())
    }

    /// The path of `uri` relative to this location, if it lies below it.
    fn relative<'a>(&self, uri: &'a str) -> Option<&'a str> {
        let root = self.uri("");
        uri.strip_prefix(&root).map(|r| r.trim_start_matches('/'))
    }

    /// Checks that the location can be written: writes and deletes a small
    /// object (or creates the directory). A clear error before any trial runs.
    pub async fn probe(&self) -> Result<(), StorageError> {
        match &*self.kind {
            Kind::Local(dir) => std::fs::create_dir_all(dir).map_err(|source| StorageError::Io { path: dir.clone(), source }),
            Kind::Object { store, .. } => {
                let path = self.object_path(".nestor-probe");
                let unreachable = |source| StorageError::Unreachable { location: self.uri(""), source };
                let attempt = async {
                    store.put(&path, PutPayload::from_static(b"nestor")).await?;
                    store.delete(&path).await
                };
                match tokio::time::timeout(Duration::from_secs(20), attempt).await {
                    Ok(r) => r.map_err(unreachable),
                    Err(_) => Err(unreachable(object_store::Error::Generic { store: "storage", source: "no answer within 20 s".into() })),
                }
            }
        }
    }

    /// Writes a small file at `rel` (replacing it).
    pub async fn put_bytes(&self, rel: &str, bytes: Vec<u8>) -> Result<(), StorageError> {
        match &*self.kind {
            Kind::Local(dir) => {
                let path = dir.join(rel);
                let io = |source| StorageError::Io { path: path.clone(), source };
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
                std::fs::write(&path, bytes).map_err(io)
            }
            Kind::Object { store, .. } => store
                .put(&self.object_path(rel), PutPayload::from(bytes))
                .await
                .map(|_| ())
                .map_err(|source| StorageError::Unreachable { location: self.uri(rel), source }),
        }
    }

    /// The bytes of the file at `rel`, or `None` when there is none.
    pub async fn get_bytes(&self, rel: &str) -> Result<Option<Vec<u8>>, StorageError> {
        match &*self.kind {
            Kind::Local(dir) => {
                let path = dir.join(rel);
                match std::fs::read(&path) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(source) => Err(StorageError::Io { path, source }),
                }
            }
            Kind::Object { store, .. } => match store.get(&self.object_path(rel)).await {
                Ok(got) => got
                    .bytes()
                    .await
                    .map(|b| Some(b.to_vec()))
                    .map_err(|source| StorageError::Unreachable { location: self.uri(rel), source }),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(source) => Err(StorageError::Unreachable { location: self.uri(rel), source }),
            },
        }
    }

    /// The files below `rel`, as paths relative to it (`/`-separated), sorted.
    pub async fn list_below(&self, rel: &str) -> Result<Vec<String>, StorageError> {
        match &*self.kind {
            Kind::Local(dir) => {
                let root = dir.join(rel);
                let mut out = Vec::new();
                let mut todo = vec![root.clone()];
                while let Some(d) = todo.pop() {
                    let Ok(entries) = std::fs::read_dir(&d) else { continue };
                    for e in entries.flatten() {
                        let p = e.path();
                        if p.is_dir() {
                            todo.push(p);
                        } else if let Ok(r) = p.strip_prefix(&root) {
                            out.push(r.to_string_lossy().replace(std::path::MAIN_SEPARATOR, "/"));
                        }
                    }
                }
                out.sort();
                Ok(out)
            }
            Kind::Object { store, .. } => {
                let prefix = self.object_path(rel);
                let skip = prefix.parts().count();
                let listed: Vec<object_store::ObjectMeta> = store
                    .list(Some(&prefix))
                    .try_collect()
                    .await
                    .map_err(|source| StorageError::Unreachable { location: self.uri(rel), source })?;
                let mut out: Vec<String> = listed
                    .iter()
                    .map(|m| m.location.parts().skip(skip).map(|p| p.as_ref().to_string()).collect::<Vec<_>>().join("/"))
                    .collect();
                out.sort();
                Ok(out)
            }
        }
    }

    /// Deletes the file at `rel` (none there is no error).
    pub async fn delete(&self, rel: &str) -> Result<(), StorageError> {
        match &*self.kind {
            Kind::Local(dir) => match std::fs::remove_file(dir.join(rel)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StorageError::Io { path: dir.join(rel), source: e }),
                _ => Ok(()),
            },
            Kind::Object { store, .. } => match store.delete(&self.object_path(rel)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(source) => Err(StorageError::Unreachable { location: self.uri(rel), source }),
            },
        }
    }

    /// Persists `src` as rank `rank`'s shard of the checkpoint of
    /// `iteration` below this (trial) location, and returns the checkpoint's
    /// URI. Local: copied, synced and renamed into place. Object store: every
    /// file uploaded (large ones in parts, in parallel).
    pub async fn upload_shard(&self, src: &Path, iteration: u64, rank: u32) -> Result<String, CheckpointError> {
        let name = checkpoint_dir_name(iteration);
        match &*self.kind {
            Kind::Local(dir) => {
                let (src, dir) = (src.to_path_buf(), dir.clone());
                let persisted = tokio::task::spawn_blocking(move || persist_checkpoint(&src, &dir, iteration, rank))
                    .await
                    .map_err(|e| CheckpointError::Io { path: PathBuf::from(&name), source: std::io::Error::other(e) })??;
                Ok(persisted.display().to_string())
            }
            Kind::Object { store, .. } => {
                let files = list_files(src)?;
                let shard = format!("{name}/rank-{rank}");
                let uploads = files.into_iter().map(|(rel, len)| {
                    let store = Arc::clone(store);
                    let from = src.join(&rel);
                    let to = self.object_path(&format!("{shard}/{rel}"));
                    let uri = self.uri(&format!("{shard}/{rel}"));
                    async move { upload_file(store, &from, len, &to).await.map_err(|source| CheckpointError::Upload { uri, source }) }
                });
                futures_util::stream::iter(uploads).buffer_unordered(FILES_IN_FLIGHT).try_collect::<Vec<()>>().await?;
                Ok(self.uri(&name))
            }
        }
    }

    /// Checks that rank `rank` uploaded its shard of the checkpoint of
    /// `iteration` here itself (`uri` is where it says it did): the URI is
    /// this location's for that iteration and the shard holds a file.
    /// Returns the checkpoint's URI.
    pub async fn check_uploaded(&self, uri: &str, iteration: u64, rank: u32) -> Result<String, CheckpointError> {
        let name = checkpoint_dir_name(iteration);
        let expected = self.uri(&name);
        if uri != expected {
            return Err(CheckpointError::NotUploaded(format!("{uri} is not this report's ({expected})")));
        }
        let Kind::Object { store, .. } = &*self.kind else {
            return Err(CheckpointError::NotUploaded(format!("{uri}: this trial's checkpoints are not in an object store")));
        };
        let shard = format!("{name}/rank-{rank}");
        let first = store.list(Some(&self.object_path(&shard))).try_next().await;
        match first {
            Ok(Some(_)) => Ok(expected),
            Ok(None) => Err(CheckpointError::NotUploaded(format!("{uri}: no file of rank {rank}'s shard is there"))),
            Err(source) => Err(CheckpointError::Upload { uri: self.uri(&shard), source }),
        }
    }

    /// Persists the staged copy `staged` (below the trial's staging
    /// directory, synced by whoever made it) as rank `rank`'s shard of the
    /// checkpoint of `iteration`, and returns the checkpoint's URI. Local:
    /// renamed into place (no byte is read again; a copy where the rename
    /// crosses file systems). Object store: uploaded, then removed.
    pub async fn adopt_shard(&self, staged: &Path, iteration: u64, rank: u32) -> Result<String, CheckpointError> {
        let Kind::Local(dir) = &*self.kind else {
            return self.upload_shard(staged, iteration, rank).await;
        };
        let (staged, dir) = (staged.to_path_buf(), dir.clone());
        let name = checkpoint_dir_name(iteration);
        tokio::task::spawn_blocking(move || {
            let ckpt = dir.join(checkpoint_dir_name(iteration));
            let dst = ckpt.join(format!("rank-{rank}"));
            let io = |path: &Path| {
                let path = path.to_path_buf();
                move |source| CheckpointError::Io { path, source }
            };
            std::fs::create_dir_all(&ckpt).map_err(io(&ckpt))?;
            if dst.exists() {
                std::fs::remove_dir_all(&dst).map_err(io(&dst))?;
            }
            match std::fs::rename(&staged, &dst) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                    persist_checkpoint(&staged, &dir, iteration, rank)?;
                }
                Err(e) => return Err(io(&dst)(e)),
            }
            std::fs::File::open(&ckpt).and_then(|d| d.sync_all()).map_err(io(&ckpt))?;
            Ok(ckpt.display().to_string())
        })
        .await
        .map_err(|e| CheckpointError::Io { path: PathBuf::from(&name), source: std::io::Error::other(e) })?
    }

    /// Makes the checkpoint `uri` available on local disk and returns its
    /// local directory (holding `rank-<r>/` shards): the directory itself for
    /// local storage, a fresh download below `scratch` for an object store
    /// (`scratch` is emptied first: it holds one restored copy at a time).
    pub async fn fetch_checkpoint(&self, uri: &str, scratch: &Path) -> Result<PathBuf, CheckpointError> {
        match &*self.kind {
            Kind::Local(_) => Ok(PathBuf::from(uri)),
            Kind::Object { store, .. } => {
                let rel = self.relative(uri).ok_or_else(|| CheckpointError::Foreign(uri.to_string()))?.to_string();
                let name = rel.rsplit('/').next().unwrap_or(&rel).to_string();
                let dest = scratch.join(&name);
                let io = |path: &Path| {
                    let path = path.to_path_buf();
                    move |source| CheckpointError::Io { path, source }
                };
                // `scratch` holds only earlier restores: one copy at a time.
                if scratch.exists() {
                    tokio::fs::remove_dir_all(scratch).await.map_err(io(scratch))?;
                }
                let downloads = self.checkpoint_files(store, &rel, uri).await?.into_iter().map(|(meta, parts)| {
                    let to = parts.iter().fold(dest.clone(), |p, s| p.join(s));
                    let store = Arc::clone(store);
                    let uri = format!("{uri}/{}", parts.join("/"));
                    async move { download_file(store, &meta.location, &uri, &to).await }
                });
                futures_util::stream::iter(downloads).buffer_unordered(FILES_IN_FLIGHT).try_collect::<Vec<()>>().await?;
                tokio::fs::create_dir_all(&dest).await.map_err(io(&dest))?;
                Ok(dest)
            }
        }
    }

    /// Downloads rank `rank`'s shard of the checkpoint `uri` (below this
    /// object store location) into `dest`: its own, or rank 0's where it
    /// saved none (as [`crate::shard_for`] picks). `Ok(false)`: the
    /// checkpoint holds neither. What a rank that reaches the store
    /// restores from, without the driver.
    pub async fn fetch_shard(&self, uri: &str, rank: u32, dest: &Path) -> Result<bool, CheckpointError> {
        let Kind::Object { store, .. } = &*self.kind else {
            return Err(CheckpointError::Foreign(format!("{uri}: this trial's checkpoints are not in an object store")));
        };
        let rel = self.relative(uri).ok_or_else(|| CheckpointError::Foreign(uri.to_string()))?.to_string();
        for shard in [format!("rank-{rank}"), "rank-0".to_string()] {
            let files = self.checkpoint_files(store, &format!("{rel}/{shard}"), uri).await?;
            if files.is_empty() {
                continue;
            }
            let downloads = files.into_iter().map(|(meta, parts)| {
                let to = parts.iter().fold(dest.to_path_buf(), |p, s| p.join(s));
                let store = Arc::clone(store);
                let uri = format!("{uri}/{shard}/{}", parts.join("/"));
                async move { download_file(store, &meta.location, &uri, &to).await }
            });
            futures_util::stream::iter(downloads).buffer_unordered(FILES_IN_FLIGHT).try_collect::<Vec<()>>().await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Copies the checkpoint at `uri` (below this location) into `dest` (a
    /// trial's storage) under the same name, every shard but not its commit
    /// marker, and returns the copy's location. A copy left half done by a
    /// crash is uncommitted, so it is deleted like any other.
    pub async fn copy_checkpoint(&self, uri: &str, dest: &Storage) -> Result<String, CheckpointError> {
        let name = uri.trim_end_matches('/').rsplit('/').next().unwrap_or(uri).to_string();
        match (&*self.kind, &*dest.kind) {
            (Kind::Local(_), Kind::Local(dir)) => {
                let (from, to) = (PathBuf::from(uri), dir.join(&name));
                let tmp = dir.join(format!(".{name}.copy"));
                tokio::task::spawn_blocking(move || -> Result<String, CheckpointError> {
                    let io = |path: &Path| {
                        let path = path.to_path_buf();
                        move |source| CheckpointError::Io { path, source }
                    };
                    for stale in [&tmp, &to] {
                        if stale.exists() {
                            std::fs::remove_dir_all(stale).map_err(io(stale))?;
                        }
                    }
                    // Shard by shard: the commit marker (which may be being written) is not copied.
                    let copied = (|| {
                        for entry in std::fs::read_dir(&from).map_err(io(&from))? {
                            let entry = entry.map_err(io(&from))?;
                            let name = entry.file_name();
                            if name == COMMITTED_MARKER || !entry.path().is_dir() {
                                continue;
                            }
                            let shard = tmp.join(&name);
                            std::fs::create_dir_all(&shard).map_err(io(&shard))?;
                            copy_tree(&entry.path(), &shard)?;
                        }
                        std::fs::rename(&tmp, &to).map_err(io(&to))
                    })();
                    if copied.is_err() {
                        // Nothing half copied stays behind.
                        let _ = std::fs::remove_dir_all(&tmp);
                    }
                    copied.map(|()| to.display().to_string())
                })
                .await
                .map_err(|e| CheckpointError::Io { path: PathBuf::from(&name), source: std::io::Error::other(e) })?
            }
            (Kind::Object { store, .. }, Kind::Object { .. }) => {
                let rel = self.relative(uri).ok_or_else(|| CheckpointError::Foreign(uri.to_string()))?.to_string();
                let copies = self.checkpoint_files(store, &rel, uri).await?.into_iter().map(|(meta, parts)| {
                    let rel_to = format!("{name}/{}", parts.join("/"));
                    let (to, to_uri) = (dest.object_path(&rel_to), dest.uri(&rel_to));
                    let store = Arc::clone(store);
                    async move { store.copy(&meta.location, &to).await.map_err(|source| CheckpointError::Upload { uri: to_uri, source }) }
                });
                futures_util::stream::iter(copies).buffer_unordered(FILES_IN_FLIGHT).try_collect::<Vec<()>>().await?;
                Ok(dest.uri(&name))
            }
            _ => Err(CheckpointError::Foreign(uri.to_string())),
        }
    }

    /// Deletes the checkpoint `uri` (every shard and the marker).
    pub async fn delete_checkpoint(&self, uri: &str) -> Result<(), CheckpointError> {
        match &*self.kind {
            Kind::Local(_) => {
                let path = PathBuf::from(uri);
                // A commit marker written meanwhile makes the removal find the directory not empty: try again.
                let mut tries = 0;
                loop {
                    match tokio::fs::remove_dir_all(&path).await {
                        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && tries < 5 => tries += 1,
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(CheckpointError::Io { path, source: e }),
                        _ => return Ok(()),
                    }
                }
            }
            Kind::Object { store, .. } => {
                let rel = self.relative(uri).ok_or_else(|| CheckpointError::Foreign(uri.to_string()))?;
                let prefix = self.object_path(rel);
                let locations = store.list(Some(&prefix)).map_ok(|m| m.location).boxed();
                store
                    .delete_stream(locations)
                    .try_collect::<Vec<_>>()
                    .await
                    .map(|_| ())
                    .map_err(|source| CheckpointError::Upload { uri: uri.to_string(), source })
            }
        }
    }

    /// Writes the `.committed` marker inside the checkpoint `uri`.
    pub async fn mark_committed(&self, uri: &str, body: Vec<u8>) -> Result<(), StorageError> {
        match &*self.kind {
            Kind::Local(_) => {
                let path = Path::new(uri).join(COMMITTED_MARKER);
                tokio::fs::write(&path, body).await.map_err(|source| StorageError::Io { path, source })
            }
            Kind::Object { .. } => match self.relative(uri) {
                Some(rel) => self.put_bytes(&format!("{rel}/{COMMITTED_MARKER}"), body).await,
                None => Err(StorageError::Invalid { location: uri.to_string(), reason: "not below this experiment's storage".into() }),
            },
        }
    }

    /// The `checkpoint_NNNNNN` locations below this (trial) location, as URIs.
    pub async fn list_checkpoints(&self) -> Result<Vec<String>, StorageError> {
        match &*self.kind {
            Kind::Local(dir) => {
                let mut out = Vec::new();
                let Ok(entries) = std::fs::read_dir(dir) else { return Ok(out) };
                for e in entries.flatten() {
                    if e.file_name().to_string_lossy().starts_with("checkpoint_") && e.path().is_dir() {
                        out.push(e.path().display().to_string());
                    }
                }
                out.sort();
                Ok(out)
            }
            Kind::Object { store, .. } => {
                let prefix = self.object_path("");
                let listed = store
                    .list_with_delimiter(Some(&prefix))
                    .await
                    .map_err(|source| StorageError::Unreachable { location: self.uri(""), source })?;
                let mut out: Vec<String> = listed
                    .common_prefixes
                    .iter()
                    .filter_map(|p| p.filename().filter(|n| n.starts_with("checkpoint_")).map(|n| self.uri(n)))
                    .collect();
                out.sort();
                Ok(out)
            }
        }
    }
}

/// Every file below `src`, with its size, as `/`-separated relative paths.
fn list_files(src: &Path) -> Result<Vec<(String, u64)>, CheckpointError> {
    if !src.is_dir() {
        return Err(CheckpointError::NotADirectory(src.to_path_buf()));
    }
    let mut out = Vec::new();
    let mut stack = vec![(src.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let io = |source| CheckpointError::Io { path: dir.clone(), source };
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let child = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            // Links are not followed (a `loop -> .` would never end; one out of the checkpoint copies what it must not).
            let meta = std::fs::symlink_metadata(entry.path()).map_err(|source| CheckpointError::Io { path: entry.path(), source })?;
            if let Some(kind) = crate::checkpoint::special_kind(meta.file_type()) {
                return Err(CheckpointError::NotAFile(entry.path(), kind));
            }
            if meta.is_dir() {
                stack.push((entry.path(), child));
            } else {
                out.push((child, meta.len()));
            }
        }
    }
    Ok(out)
}

async fn upload_file(store: Arc<dyn ObjectStore>, from: &Path, len: u64, to: &ObjPath) -> Result<(), object_store::Error> {
    let generic = |e: std::io::Error| object_store::Error::Generic { store: "local file", source: Box::new(e) };
    if len < MULTIPART_THRESHOLD {
        let bytes = tokio::fs::read(from).await.map_err(generic)?;
        store.put(to, PutPayload::from(bytes)).await?;
        return Ok(());
    }
    let upload = store.put_multipart(to).await?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
    match send_parts(&mut writer, from).await {
        Ok(()) => writer.finish().await.map(|_| ()),
        Err(e) => {
            // No half-written object, and no parts left for the store to keep.
            let _ = writer.abort().await;
            Err(e)
        }
    }
}

/// Reads `from` in parts and hands them to `writer`, a few in flight.
async fn send_parts(writer: &mut WriteMultipart, from: &Path) -> Result<(), object_store::Error> {
    let generic = |e: std::io::Error| object_store::Error::Generic { store: "local file", source: Box::new(e) };
    let mut file = tokio::fs::File::open(from).await.map_err(generic)?;
    loop {
        let mut buf = vec![0u8; PART_SIZE];
        let mut filled = 0;
        while filled < PART_SIZE {
            let n = file.read(&mut buf[filled..]).await.map_err(generic)?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            return Ok(());
        }
        buf.truncate(filled);
        writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
        writer.put(bytes::Bytes::from(buf));
        if filled < PART_SIZE {
            return Ok(());
        }
    }
}

async fn download_file(store: Arc<dyn ObjectStore>, from: &ObjPath, uri: &str, to: &Path) -> Result<(), CheckpointError> {
    use tokio::io::AsyncWriteExt;
    let io = |source| CheckpointError::Io { path: to.to_path_buf(), source };
    if let Some(parent) = to.parent() {
        tokio::fs::create_dir_all(parent).await.map_err(io)?;
    }
    let got = store.get(from).await.map_err(|source| CheckpointError::Upload { uri: uri.to_string(), source })?;
    let mut stream = got.into_stream();
    let mut file = tokio::fs::File::create(to).await.map_err(io)?;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|source| CheckpointError::Upload { uri: uri.to_string(), source })?;
        file.write_all(&chunk).await.map_err(io)?;
    }
    file.flush().await.map_err(io)
}

/// The object store at `base` (`s3://bucket`, `gs://...`, `az://...`),
/// configured from the environment as the provider's tools read it: the
/// client checkpoints use, and data sets' URLs too.
#[cfg(feature = "cloud")]
pub fn cloud_store(scheme: &str, base: &str) -> Result<Arc<dyn ObjectStore>, String> {
    crate::tls::install_crypto();
    let retry = object_store::RetryConfig {
        backoff: object_store::BackoffConfig { init_backoff: Duration::from_millis(50), max_backoff: Duration::from_secs(2), base: 2.0 },
        max_retries: 3,
        retry_timeout: Duration::from_secs(30),
    };
    // Timeouts as config keys: client options given whole would replace
    // what the environment set (e.g. AWS_ALLOW_HTTP).
    use object_store::ClientConfigKey::{ConnectTimeout, Timeout};
    let (connect, total) = ("5s", "300s");
    let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match scheme {
        "s3" | "s3a" => object_store::aws::AmazonS3Builder::from_env()
            .with_url(base)
            .with_retry(retry)
            .with_config(object_store::aws::AmazonS3ConfigKey::Client(ConnectTimeout), connect)
            .with_config(object_store::aws::AmazonS3ConfigKey::Client(Timeout), total)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
        "gs" => object_store::gcp::GoogleCloudStorageBuilder::from_env()
            .with_url(base)
            .with_retry(retry)
            .with_config(object_store::gcp::GoogleConfigKey::Client(ConnectTimeout), connect)
            .with_config(object_store::gcp::GoogleConfigKey::Client(Timeout), total)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
        "az" | "azure" | "abfs" | "abfss" => object_store::azure::MicrosoftAzureBuilder::from_env()
            .with_url(base)
            .with_retry(retry)
            .with_config(object_store::azure::AzureConfigKey::Client(ConnectTimeout), connect)
            .with_config(object_store::azure::AzureConfigKey::Client(Timeout), total)
            .build()
            .map(|s| Arc::new(s) as Arc<dyn ObjectStore>),
        other => return Err(format!("unknown scheme `{other}://` (use a local path, s3://, gs:// or az://)")),
    };
    built.map_err(|e| e.to_string())
}

/// Built without the `cloud` feature: no object store.
#[cfg(not(feature = "cloud"))]
pub fn cloud_store(scheme: &str, _base: &str) -> Result<Arc<dyn ObjectStore>, String> {
    Err(format!(
        "`{scheme}://` needs the object stores, which this build of nestor leaves out: build it with the `cloud` feature (a default one)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_and_urls() {
        let local = Storage::parse("/tmp/runs").unwrap();
        assert!(local.is_local());
        assert_eq!(local.join("exp/trials/t1").uri("checkpoint_000001"), "/tmp/runs/exp/trials/t1/checkpoint_000001");
        assert!(Storage::parse("file:///tmp/x").unwrap().is_local());
        let s3 = Storage::parse("s3://bucket/some/prefix/").unwrap();
        assert!(!s3.is_local());
        let t = s3.join("exp").join("trials/t1");
        assert_eq!(t.uri("checkpoint_000002"), "s3://bucket/some/prefix/exp/trials/t1/checkpoint_000002");
        assert_eq!(t.relative("s3://bucket/some/prefix/exp/trials/t1/checkpoint_000002"), Some("checkpoint_000002"));
        assert_eq!(Storage::parse("s3://b").unwrap().uri(""), "s3://b");
        let err = Storage::parse("ftp://host/x").unwrap_err().to_string();
        assert!(err.contains("unknown scheme `ftp://`"), "{err}");
        assert!(Storage::parse("s3:///x").unwrap_err().to_string().contains("no bucket"));
    }
}
