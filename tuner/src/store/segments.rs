//! The scheduler's journal on disk: append-only segment files beside the
//! sled database, `journal/<generation>.log`. A segment starts with a
//! snapshot of the scheduler's whole state and goes on with the hook calls
//! made after it. Each record is its length and CRC-32 (both u32,
//! little-endian) and then its bytes; a record torn by a crash ends the
//! segment there.
//!
//! The journal lives outside sled because sled keeps every value it has
//! written in memory; an append-only file keeps nothing. Calls and
//! snapshots wait in memory until a flush: each flush takes those made
//! before it starts, makes the database durable, and only then writes
//! them. So the journal never runs ahead of the database: every call in it
//! was made before a flush that covered what the loop did about it (the
//! database may hold a little more, from writes after the last flush; a
//! resume squares that with the trials' records). A new segment is synced
//! at once and the ones before it are deleted. Calls are written without a
//! sync: the page cache keeps them when the driver dies; if the machine
//! loses power the journal may end earlier than the database, which a
//! resume squares the same way.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// What waits for the next flush, and the segment being written.
#[derive(Default)]
pub(super) struct Segments {
    pending: Mutex<Vec<Op>>,
    current: Mutex<Option<File>>,
}

/// One write waiting for a flush.
pub(super) enum Op {
    /// A hook call, appended to the current segment.
    Call(Vec<u8>),
    /// A new segment, `generation`, starting with this snapshot.
    Start { generation: u64, snapshot: Vec<u8> },
}

fn dir(store: &Path) -> PathBuf {
    store.join("journal")
}

fn segment(store: &Path, generation: u64) -> PathBuf {
    dir(store).join(format!("{generation:020}.log"))
}

impl Segments {
    /// Queues `op` for the next flush.
    pub(super) fn push(&self, op: Op) {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).push(op);
    }

    /// What was queued so far, for a flush that is starting.
    pub(super) fn take(&self) -> Vec<Op> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Writes `ops` (taken before a flush that has made the database
    /// durable): calls appended, a new segment created, synced, and the
    /// ones before it deleted; then syncs what the current segment holds.
    pub(super) fn write(&self, store: &Path, ops: Vec<Op>) -> std::io::Result<()> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let mut calls = Vec::new();
        for op in ops {
            match op {
                Op::Call(bytes) => frame(&mut calls, &bytes)?,
                Op::Start { generation, snapshot } => {
                    if let Some(file) = current.as_mut() {
                        file.write_all(&std::mem::take(&mut calls))?;
                    }
                    std::fs::create_dir_all(dir(store))?;
                    let mut file = OpenOptions::new().create(true).write(true).truncate(true).open(segment(store, generation))?;
                    let mut first = Vec::new();
                    frame(&mut first, &snapshot)?;
                    file.write_all(&first)?;
                    file.sync_data()?;
                    File::open(dir(store))?.sync_all()?;
                    // The new snapshot is durable: what came before it is not needed.
                    for older in list(store)?.into_iter().filter(|&g| g < generation) {
                        std::fs::remove_file(segment(store, older))?;
                    }
                    *current = Some(file);
                }
            }
        }
        if let Some(file) = current.as_mut() {
            file.write_all(&calls)?;
        }
        Ok(())
    }

    /// Goes on appending to segment `generation` after its last whole
    /// record; segments after it (whose snapshot was torn) are deleted.
    pub(super) fn resume(&self, store: &Path, generation: u64) -> std::io::Result<()> {
        for later in list(store)?.into_iter().filter(|&g| g > generation) {
            std::fs::remove_file(segment(store, later))?;
        }
        let path = segment(store, generation);
        let (_, valid) = read(&path)?;
        let file = OpenOptions::new().append(true).open(&path)?;
        if file.metadata()?.len() > valid {
            file.set_len(valid)?;
        }
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(file);
        Ok(())
    }
}

/// Appends `bytes` framed as a record to `out`.
fn frame(out: &mut Vec<u8>, bytes: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| std::io::Error::other("journal record over 4 GiB"))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

/// The generations of the segments on disk, in order.
fn list(store: &Path) -> std::io::Result<Vec<u64>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir(store)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        if let Some(generation) = name.to_str().and_then(|n| n.strip_suffix(".log")).and_then(|n| n.parse().ok()) {
            out.push(generation);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// A segment read back: its generation and its whole records, the snapshot first.
pub(crate) type Segment = (u64, Vec<Vec<u8>>);

/// The newest segment that holds a whole record (its snapshot).
pub(super) fn latest(store: &Path) -> std::io::Result<Option<Segment>> {
    for generation in list(store)?.into_iter().rev() {
        let (records, _) = read(&segment(store, generation))?;
        if !records.is_empty() {
            return Ok(Some((generation, records)));
        }
    }
    Ok(None)
}

/// A segment's whole records, and the length they take: whatever follows
/// them is a record torn by a crash.
fn read(path: &Path) -> std::io::Result<(Vec<Vec<u8>>, u64)> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => f.read_to_end(&mut bytes)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(header) = bytes.get(at..at + 8) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let Some(body) = bytes.get(at + 8..at + 8 + len) else { break };
        if crc32fast::hash(body) != crc {
            break;
        }
        out.push(body.to_vec());
        at += 8 + len;
    }
    Ok((out, at as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(records: &[Vec<u8>]) -> Vec<String> {
        records.iter().map(|r| String::from_utf8_lossy(r).into_owned()).collect()
    }

    fn call(s: &str) -> Op {
        Op::Call(s.as_bytes().to_vec())
    }

    fn start(generation: u64) -> Op {
        Op::Start { generation, snapshot: format!("snapshot {generation}").into_bytes() }
    }

    #[test]
    fn nothing_is_written_before_a_flush_and_a_torn_record_ends_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let segments = Segments::default();
        for op in [start(0), call("one"), call("two"), call("three")] {
            segments.push(op);
        }
        assert!(latest(dir.path()).unwrap().is_none(), "written before a flush");
        segments.write(dir.path(), segments.take()).unwrap();
        assert_eq!(strings(&latest(dir.path()).unwrap().unwrap().1), ["snapshot 0", "one", "two", "three"]);
        // A crash in the middle of the last record's write.
        let path = segment(dir.path(), 0);
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 2).unwrap();
        assert_eq!(strings(&latest(dir.path()).unwrap().unwrap().1), ["snapshot 0", "one", "two"]);
        // Appends go on after the last whole record.
        let segments = Segments::default();
        segments.resume(dir.path(), 0).unwrap();
        segments.write(dir.path(), vec![call("four")]).unwrap();
        assert_eq!(strings(&latest(dir.path()).unwrap().unwrap().1), ["snapshot 0", "one", "two", "four"]);
        // A flipped bit ends it too.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8 + 10 + 8 + 3 + 8] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(strings(&latest(dir.path()).unwrap().unwrap().1), ["snapshot 0", "one"]);
    }

    #[test]
    fn a_new_segment_replaces_the_ones_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let segments = Segments::default();
        segments.write(dir.path(), vec![start(0), call("a"), call("b"), start(1), call("c")]).unwrap();
        assert_eq!(list(dir.path()).unwrap(), vec![1]);
        assert_eq!(latest(dir.path()).unwrap().unwrap(), (1, vec![b"snapshot 1".to_vec(), b"c".to_vec()]));
        // A segment whose snapshot is torn does not count, and a resume deletes it.
        std::fs::write(segment(dir.path(), 2), b"\x0a\0\0").unwrap();
        assert_eq!(latest(dir.path()).unwrap().unwrap().0, 1);
        segments.resume(dir.path(), 1).unwrap();
        assert_eq!(list(dir.path()).unwrap(), vec![1]);
    }
}
