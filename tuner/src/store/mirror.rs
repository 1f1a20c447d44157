//! The result store in an object store, beside the checkpoints, when the
//! experiment's storage is one (`s3://`, `gs://`, `az://`): what makes
//! `nestor status/best/export <url>` and a resume from the bucket alone
//! work on another machine.
//!
//! Not the database's files synced: sled rewrites its one large file in
//! place, so each durable point would upload megabytes. Instead, a log of
//! changes that needs no sync: every write to the store is also recorded
//! (tree, key, value or removal; the scheduler's journal calls), and each
//! flush, once the local database is durable, uploads what was recorded
//! since the last one as one object, `store/log/<seq>`, before its results
//! are acknowledged. Every `BASE_EVERY` logs, the whole store is written as
//! `store/base-<seq>` and the logs before it are deleted, so a reader
//! fetches one base and at most that many logs. Reading it back
//! ([`materialize`]) replays them, in order, into a fresh database: the
//! changes are puts and removals of whole values, so a change both in a
//! base and in the log after it (made while the base was being written)
//! replays to the same state.
//!
//! An object: `NSTMIR01`, then records of a kind byte and length-prefixed
//! fields (u32 little-endian), then the CRC-32 of all before it.

use std::path::Path;
use std::sync::mpsc as sync_mpsc;
use std::sync::{Mutex, PoisonError};

use trainer::{Storage, StorageError};

use super::segments::Op;

/// A base every this many logs.
const BASE_EVERY: u64 = 256;

/// How often a mirror that fell behind tries to catch up.
const RETRY_BEHIND: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a flush waits for the object store's answer before the copy
/// falls behind (the upload goes on; a later base covers whatever it was).
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

const MAGIC: &[u8; 8] = b"NSTMIR01";

/// The store's trees, as a byte in a record.
pub(super) const TREES: [&str; 5] = ["meta", "trials", "results", "checkpoints", "exploits"];

/// One recorded change.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Change {
    Put {
        tree: u8,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Remove {
        tree: u8,
        key: Vec<u8>,
    },
    /// A call appended to the scheduler's journal.
    Call(Vec<u8>),
    /// A new journal segment, starting with this snapshot.
    Start {
        generation: u64,
        snapshot: Vec<u8>,
    },
}

fn field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// The object holding `changes`.
pub(super) fn encode(changes: &[Change]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    for c in changes {
        match c {
            Change::Put { tree, key, value } => {
                out.extend_from_slice(&[1, *tree]);
                field(&mut out, key);
                field(&mut out, value);
            }
            Change::Remove { tree, key } => {
                out.extend_from_slice(&[2, *tree]);
                field(&mut out, key);
            }
            Change::Call(bytes) => {
                out.push(3);
                field(&mut out, bytes);
            }
            Change::Start { generation, snapshot } => {
                out.push(4);
                out.extend_from_slice(&generation.to_le_bytes());
                field(&mut out, snapshot);
            }
        }
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The changes an object holds; why not, when it is not whole.
pub(super) fn decode(bytes: &[u8]) -> Result<Vec<Change>, String> {
    if bytes.len() < MAGIC.len() + 4 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("not a nestor store log".into());
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body).to_le_bytes() != crc {
        return Err("its checksum does not match (torn or altered)".into());
    }
    let mut at = MAGIC.len();
    let short = || "it ends inside a record".to_string();
    let take = |at: &mut usize, n: usize| -> Result<&[u8], String> {
        let s = body.get(*at..*at + n).ok_or_else(short)?;
        *at += n;
        Ok(s)
    };
    let field = |at: &mut usize| -> Result<Vec<u8>, String> {
        let len = u32::from_le_bytes(take(at, 4)?.try_into().map_err(|_| short())?) as usize;
        Ok(take(at, len)?.to_vec())
    };
    let mut out = Vec::new();
    while at < body.len() {
        let kind = take(&mut at, 1)?[0];
        out.push(match kind {
            1 | 2 => {
                let tree = take(&mut at, 1)?[0];
                if usize::from(tree) >= TREES.len() {
                    return Err(format!("tree {tree} is not one of the store's"));
                }
                let key = field(&mut at)?;
                if kind == 1 {
                    Change::Put { tree, key, value: field(&mut at)? }
                } else {
                    Change::Remove { tree, key }
                }
            }
            3 => Change::Call(field(&mut at)?),
            4 => {
                let generation = u64::from_le_bytes(take(&mut at, 8)?.try_into().map_err(|_| short())?);
                Change::Start { generation, snapshot: field(&mut at)? }
            }
            other => return Err(format!("record kind {other} is unknown")),
        });
    }
    Ok(out)
}

/// `log/00000000000000000042`.
fn log_name(seq: u64) -> String {
    format!("log/{seq:020}")
}

fn base_name(seq: u64) -> String {
    format!("base-{seq:020}")
}

/// What the object store holds of a store: its latest base and the logs after it.
struct Listing {
    base: Option<u64>,
    logs: Vec<u64>,
}

async fn listing(storage: &Storage) -> Result<Listing, StorageError> {
    let names = storage.list_below("").await?;
    let base = names.iter().filter_map(|n| n.strip_prefix("base-")?.parse::<u64>().ok()).max();
    let mut logs: Vec<u64> = names.iter().filter_map(|n| n.strip_prefix("log/")?.parse::<u64>().ok()).collect();
    logs.retain(|&s| base.is_none_or(|b| s > b));
    logs.sort_unstable();
    Ok(Listing { base, logs })
}

/// The number the next log at `storage` takes (0 where there is none).
pub(super) async fn next_seq(storage: &Storage) -> Result<u64, StorageError> {
    let l = listing(storage).await?;
    Ok(l.logs.last().copied().or(l.base).map_or(0, |s| s + 1))
}

/// Replays the store mirrored at `storage` (its latest base, then every
/// log after it, in order) as changes; and the sequence number the next
/// log takes. Stops at a gap in the logs (a flush that failed to upload:
/// nothing after it was acknowledged).
pub(super) async fn read_all(storage: &Storage) -> Result<(Vec<Change>, u64), String> {
    let l = listing(storage).await.map_err(|e| e.to_string())?;
    let mut changes = Vec::new();
    let mut next = 0;
    if let Some(b) = l.base {
        let bytes = storage.get_bytes(&base_name(b)).await.map_err(|e| e.to_string())?.ok_or("its base vanished")?;
        changes.extend(decode(&bytes).map_err(|e| format!("{}: {e}", storage.uri(&base_name(b))))?);
        next = b + 1;
    }
    for seq in l.logs {
        if seq != next {
            break;
        }
        let bytes = storage.get_bytes(&log_name(seq)).await.map_err(|e| e.to_string())?.ok_or("a log vanished")?;
        changes.extend(decode(&bytes).map_err(|e| format!("{}: {e}", storage.uri(&log_name(seq))))?);
        next = seq + 1;
    }
    Ok((changes, next))
}

/// One upload for the mirror's thread, and where its answer goes.
struct Job {
    storage: Storage,
    put: Vec<(String, Vec<u8>)>,
    /// After the puts: every log up to this number, and every base before it, deleted.
    prune: Option<u64>,
    reply: sync_mpsc::Sender<Result<(), StorageError>>,
}

/// A store's mirror: what was recorded since the last flush, and the thread
/// that uploads (with a runtime of its own, so a flush works from any
/// thread, inside a runtime or not).
pub(super) struct Mirror {
    storage: Storage,
    recorded: Mutex<Vec<Change>>,
    next: Mutex<u64>,
    /// Since when the object store could not be written (the mirror is behind).
    behind: Mutex<Option<std::time::Instant>>,
    jobs: Mutex<sync_mpsc::Sender<Job>>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror").field("storage", &self.storage.uri("")).finish_non_exhaustive()
    }
}

impl Mirror {
    /// A mirror at `storage` whose next log is `next`.
    pub(super) fn new(storage: Storage, next: u64) -> std::io::Result<Self> {
        // A client of its own: one an object store's client made for another runtime would hand this
        // thread's runtime connections that runtime drives (and the other way round), which then hang.
        let storage = Storage::parse(&storage.uri("")).map_err(std::io::Error::other)?;
        let (tx, rx) = sync_mpsc::channel::<Job>();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("nestor-store-mirror".into()).spawn(move || {
            while let Ok(job) = rx.recv() {
                let done = runtime.block_on(async {
                    for (rel, bytes) in job.put {
                        job.storage.put_bytes(&rel, bytes).await?;
                    }
                    match job.prune {
                        Some(seq) => prune(&job.storage, seq).await,
                        None => Ok(()),
                    }
                });
                let _ = job.reply.send(done);
            }
        })?;
        Ok(Self { storage, recorded: Mutex::default(), next: Mutex::new(next), behind: Mutex::default(), jobs: Mutex::new(tx) })
    }

    /// Records a change for the next flush.
    pub(super) fn record(&self, change: Change) {
        self.recorded.lock().unwrap_or_else(PoisonError::into_inner).push(change);
    }

    /// What was recorded so far, for a flush that is starting (with the
    /// journal's operations it takes, in their order).
    pub(super) fn take(&self, journal: &[Op]) -> Vec<Change> {
        let mut out = std::mem::take(&mut *self.recorded.lock().unwrap_or_else(PoisonError::into_inner));
        out.extend(journal.iter().map(|op| match op {
            Op::Call(bytes) => Change::Call(bytes.clone()),
            Op::Start { generation, snapshot } => Change::Start { generation: *generation, snapshot: snapshot.clone() },
        }));
        out
    }

    fn run(&self, put: Vec<(String, Vec<u8>)>, prune: Option<u64>) -> Result<(), StorageError> {
        let (reply, answer) = sync_mpsc::channel();
        let job = Job { storage: self.storage.clone(), put, prune, reply };
        let sent = self.jobs.lock().unwrap_or_else(PoisonError::into_inner).send(job);
        let gone = || StorageError::Invalid { location: self.storage.uri(""), reason: "the store's uploader has stopped".into() };
        sent.map_err(|_| gone())?;
        match answer.recv_timeout(DEADLINE) {
            Ok(done) => done,
            Err(sync_mpsc::RecvTimeoutError::Timeout) => {
                Err(StorageError::Invalid { location: self.storage.uri(""), reason: format!("no answer within {} s", DEADLINE.as_secs()) })
            }
            Err(sync_mpsc::RecvTimeoutError::Disconnected) => Err(gone()),
        }
    }

    /// Keeps the journal's operations of a flush that did not upload
    /// ([`super::Store::flush_local`]): they go up, in their order, with the
    /// next flush's changes.
    pub(super) fn defer(&self, journal: &[Op]) {
        let mut recorded = self.recorded.lock().unwrap_or_else(PoisonError::into_inner);
        recorded.extend(journal.iter().map(|op| match op {
            Op::Call(bytes) => Change::Call(bytes.clone()),
            Op::Start { generation, snapshot } => Change::Start { generation: *generation, snapshot: snapshot.clone() },
        }));
    }

    /// Uploads `changes` as the next log (nothing when there are none); when
    /// a base is due, `base` gives the whole store's changes and it is
    /// written too, the logs before it deleted. Called by a flush, after
    /// the local database is durable.
    /// Returns the number of the object written.
    ///
    /// An object store that cannot be reached does not stop the sweep: the
    /// local store is durable, results are acknowledged from it, and the
    /// mirror falls behind (said once); then, at most every
    /// [`RETRY_BEHIND`], a flush writes the whole store as a base instead
    /// of a log, and once one is written the mirror is whole again.
    pub(super) fn upload(&self, changes: Vec<Change>, base: impl FnOnce() -> Vec<Change>) -> Result<Option<u64>, StorageError> {
        let mut behind = self.behind.lock().unwrap_or_else(PoisonError::into_inner);
        if changes.is_empty() && behind.is_none() {
            return Ok(None);
        }
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = *next;
        let written = match *behind {
            Some(since) if since.elapsed() < RETRY_BEHIND => return Ok(None),
            // Behind: the whole store, in place of the logs that did not go up.
            Some(_) => self.run(vec![(base_name(seq), encode(&base()))], Some(seq)),
            None => self.run(vec![(log_name(seq), encode(&changes))], None).and_then(|()| {
                if seq > 0 && seq.is_multiple_of(BASE_EVERY) {
                    // The whole store as of this log: readers start here, the logs up to it go.
                    self.run(vec![(base_name(seq), encode(&base()))], Some(seq))
                } else {
                    Ok(())
                }
            }),
        };
        match written {
            Ok(()) => {
                if behind.take().is_some() {
                    eprintln!("nestor: the result store's copy at {} is whole again", self.storage.uri(""));
                }
                *next = seq + 1;
                Ok(Some(seq))
            }
            Err(e) => {
                if behind.is_none() {
                    eprintln!(
                        "nestor: the result store's copy at {} falls behind ({e}); results are acknowledged once on this machine's disk, \
                         and the copy catches up when the object store answers again",
                        self.storage.uri("")
                    );
                }
                *behind = Some(std::time::Instant::now());
                Ok(None)
            }
        }
    }
}

/// Writes `all` (the whole store) as the base numbered `seq` at `storage`,
/// then deletes the logs and bases before it.
pub(super) async fn write_base(storage: &Storage, seq: u64, all: &[Change]) -> Result<(), StorageError> {
    storage.put_bytes(&base_name(seq), encode(all)).await?;
    prune(storage, seq).await
}

/// Deletes every log up to `seq` and every base before it.
async fn prune(storage: &Storage, seq: u64) -> Result<(), StorageError> {
    for name in storage.list_below("").await? {
        let old_log = name.strip_prefix("log/").and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n <= seq);
        let old_base = name.strip_prefix("base-").and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n < seq);
        if old_log || old_base {
            storage.delete(&name).await?;
        }
    }
    Ok(())
}

/// The local store's own record of how far its mirror went (`mirror-seq` in its directory).
pub(super) fn local_seq(store: &Path) -> Option<u64> {
    std::fs::read_to_string(store.join("mirror-seq")).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_log_reads_back_as_written_and_a_torn_one_is_refused() {
        let changes = vec![
            Change::Put { tree: 2, key: b"t\0\0\0\0\0\0\0\0\x01".to_vec(), value: b"{\"x\":1}".to_vec() },
            Change::Remove { tree: 1, key: b"trial_00001".to_vec() },
            Change::Start { generation: 7, snapshot: vec![0, 1, 2, 255] },
            Change::Call(Vec::new()),
        ];
        let bytes = encode(&changes);
        assert_eq!(decode(&bytes).unwrap(), changes);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        let mut flipped = bytes.clone();
        flipped[12] ^= 1;
        assert!(decode(&flipped).unwrap_err().contains("checksum"));
        assert_eq!(decode(&encode(&[])).unwrap(), Vec::<Change>::new());
    }
}
