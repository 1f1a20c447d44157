//! Reading a store without writing a byte where it lives: the store's files
//! are copied, under a shared lock on its database file, to a private
//! directory in memory (`/dev/shm`, else the temporary directory), and
//! opened there. So `nestor status`, `best` and `export` read the results
//! of an experiment on a full disk or on a read-only copy, and never
//! change what a later `nestor resume` finds.

use std::path::{Path, PathBuf};

use super::StoreError;

/// A private copy of a store's files; removed when the last handle goes.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(super) dir: PathBuf,
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Snapshot {
    /// Copies the store at `store` (every file but the scheduler's journal)
    /// while holding a shared lock on its `db` file, so no sweep writes it
    /// meanwhile: one holding it already (a running sweep) makes this
    /// [`StoreError::Locked`].
    pub(crate) fn take(store: &Path) -> Result<(Self, PathBuf), StoreError> {
        let io = |what: &Path, e: std::io::Error| StoreError::Corrupt {
            path: store.to_path_buf(),
            key: what.display().to_string(),
            message: format!("cannot read it: {e}"),
        };
        let db = store.join("db");
        let file = std::fs::File::open(&db).map_err(|e| io(&db, e))?;
        shared_lock(&file).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => StoreError::Locked(store.to_path_buf()),
            _ => io(&db, e),
        })?;
        let snapshot = Self { dir: private_dir(store).map_err(|e| io(Path::new("a private copy"), e))? };
        let copy = snapshot.dir.join("store");
        copy_tree(store, &copy, true).map_err(|(p, e)| io(&p, e))?;
        // The lock goes with `file`, once the copy is whole.
        drop(file);
        Ok((snapshot, copy))
    }
}

fn shared_lock(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor this function's caller owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A new directory of this process's own, in memory where there is room.
fn private_dir(store: &Path) -> std::io::Result<PathBuf> {
    let size = dir_size(store);
    let shm = Path::new("/dev/shm");
    let base =
        if shm.is_dir() && free_bytes(shm).is_some_and(|f| f > size.saturating_mul(2)) { shm.to_path_buf() } else { std::env::temp_dir() };
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let dir = base.join(format!("nestor-read-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

/// Bytes free for an unprivileged writer on the file system holding `path`.
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into the zeroed struct it is given.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(c.as_ptr(), &mut s) } == 0).then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// Copies `from` into a new `to`, the journal left out at the top.
fn copy_tree(from: &Path, to: &Path, top: bool) -> Result<(), (PathBuf, std::io::Error)> {
    std::fs::create_dir(to).map_err(|e| (to.to_path_buf(), e))?;
    for entry in std::fs::read_dir(from).map_err(|e| (from.to_path_buf(), e))? {
        let entry = entry.map_err(|e| (from.to_path_buf(), e))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(|e| (src.clone(), e))?;
        if kind.is_dir() {
            if !(top && entry.file_name() == "journal") {
                copy_tree(&src, &dst, false)?;
            }
        } else if kind.is_file() {
            std::fs::copy(&src, &dst).map_err(|e| (src.clone(), e))?;
        }
    }
    Ok(())
}
