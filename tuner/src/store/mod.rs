//! The result store: one sled database per experiment, the experiment's
//! state of record. `nestor status`, `best`, `export` and resume read it.
//!
//! Trees: `meta` (experiment file, searcher and scheduler state), `trials`
//! (one record per trial), `results` (key: trial id, 0x00, big-endian
//! sequence number, so a prefix scan is a trial's time series),
//! `checkpoints` (committed checkpoints; key: trial id, 0x00, big-endian
//! iteration) and `exploits`. Values are versioned JSON. Beside the
//! database, `journal/` holds the scheduler's hook calls since its latest
//! snapshot (segments.rs).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod mirror;
mod segments;
mod snapshot;
use segments::{Op, Segment, Segments};
pub(crate) use snapshot::free_bytes;

use schedulers::TrialStatus;
use search::{Config, Metrics, TrialResult};

/// Version written into every record.
pub const RECORD_VERSION: u32 = 1;

/// Errors of the result store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or written.
    #[error("result store {path}: {source}")]
    Sled {
        /// The store's directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: sled::Error,
    },
    /// Another process holds the store.
    #[error("result store {0} is in use by a running sweep; `nestor status` shows its progress, the store opens once it ends")]
    Locked(PathBuf),
    /// A record could not be decoded.
    #[error("result store {path}: corrupt record under {key}: {message}")]
    Corrupt {
        /// The store's directory.
        path: PathBuf,
        /// The record's key.
        key: String,
        /// Why.
        message: String,
    },
    /// No store at this path.
    #[error("no nestor experiment at {0} (no result store found)")]
    Missing(PathBuf),
}

/// A committed checkpoint: every shard it names is persisted in storage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// Record version.
    pub version: u32,
    /// Iteration it was reported with.
    pub iteration: u64,
    /// Its location (`.../checkpoint_NNNNNN`, holding `rank-<r>/` shards):
    /// a local directory or a URL such as `s3://bucket/prefix/...`.
    #[serde(alias = "path")]
    pub uri: String,
    /// The ranks that saved a shard.
    #[serde(default = "rank_0")]
    pub ranks: Vec<u32>,
    /// The world size of the run that saved it.
    #[serde(default = "one")]
    pub world_size: u32,
    /// The metrics reported with it.
    #[serde(default, with = "search::metrics_serde")]
    pub metrics: Metrics,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn rank_0() -> Vec<u32> {
    vec![0]
}

fn one() -> u32 {
    1
}

impl CheckpointRecord {
    /// The number of workers a restore from it needs: any, when only rank 0
    /// saved a shard (every rank reads it), else the saving run's.
    pub fn required_world_size(&self) -> Option<u32> {
        if self.ranks.iter().all(|&r| r == 0) {
            None
        } else {
            Some(self.world_size)
        }
    }
}

/// Everything the store knows about one trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// Record version.
    pub version: u32,
    /// Trial id.
    pub id: String,
    /// Creation order, 0-based.
    pub index: u64,
    /// The trial's config.
    pub config: Config,
    /// Lifecycle state.
    pub status: TrialStatus,
    /// Unix time of creation.
    pub created_at: f64,
    /// Unix time of the latest start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<f64>,
    /// Unix time it ended (TERMINATED or ERROR).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<f64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How many times it was restarted (after an interruption or failure).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
    /// How many times it resumed after the scheduler paused it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumes: u32,
    /// How many of its runs failed (a rank died, exited non-zero or hung).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    /// How many of its runs the infrastructure ended (a node lost under
    /// it, a job step the cluster killed): not counted in `failures`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub infrastructure_failures: u32,
    /// Why its latest failed run failed (it was restarted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
    /// Results stored so far (the next result's sequence number).
    pub num_results: u64,
    /// Training time accumulated over all runs, in seconds.
    pub time_total_s: f64,
    /// Its latest result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_result: Option<TrialResult>,
    /// Its latest committed checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_checkpoint: Option<CheckpointRecord>,
    /// The bundles of its latest run, one per rank (CPUs, GPUs, memory, custom).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<trainer::WorkerBundle>,
    /// How many times it took over another trial's checkpoint and explored
    /// config (population-based training).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub exploits: u32,
    /// An exploit decided but not yet carried out: done before it runs
    /// again, also after a crash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_exploit: Option<schedulers::Exploit>,
    /// The workers it runs with, once a resource-changing scheduler has
    /// changed them (`None`: the experiment's `num_workers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_workers: Option<u32>,
    /// How many times its number of workers was changed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resizes: u32,
    /// Stopped to restart with another number of workers (not a restart
    /// after a failure).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resizing: bool,
    /// The decision on one of its results that ends its current run (the
    /// scheduler's, or `Stop` for its stop criteria), kept from when it is
    /// made until the run has exited: after a crash in between, the resume
    /// carries it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided: Option<schedulers::Decision>,
}

/// One exploit carried out: `trial_id` restarted from `donor`'s checkpoint
/// with an explored config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExploitRecord {
    /// The recipient.
    pub trial_id: String,
    /// Which of its exploits this is, 0-based.
    pub n: u32,
    /// Its iteration when it stopped to exploit.
    pub iteration: u64,
    /// The trial it took the checkpoint of.
    pub donor: String,
    /// The donor's checkpoint (the one it was ranked with).
    pub donor_checkpoint: String,
    /// The iteration it was saved at, where the recipient continues.
    pub donor_iteration: u64,
    /// The recipient's copy of it.
    pub checkpoint: String,
    /// The recipient's config before.
    pub old_config: Config,
    /// And after.
    pub new_config: Config,
    /// Unix time it was carried out.
    pub at: f64,
}

impl TrialRecord {
    /// A new PENDING trial.
    pub fn new(id: String, index: u64, config: Config, created_at: f64) -> Self {
        Self {
            version: RECORD_VERSION,
            id,
            index,
            config,
            status: TrialStatus::Pending,
            created_at,
            started_at: None,
            ended_at: None,
            error: None,
            restarts: 0,
            resumes: 0,
            failures: 0,
            infrastructure_failures: 0,
            last_failure: None,
            num_results: 0,
            time_total_s: 0.0,
            last_result: None,
            latest_checkpoint: None,
            resources: Vec::new(),
            exploits: 0,
            pending_exploit: None,
            num_workers: None,
            resizes: 0,
            resizing: false,
            decided: None,
        }
    }
}

/// The sled result store of one experiment.
#[derive(Clone)]
pub struct Store {
    path: PathBuf,
    db: sled::Db,
    meta: sled::Tree,
    trials: sled::Tree,
    results: sled::Tree,
    checkpoints: sled::Tree,
    exploits: sled::Tree,
    segments: Arc<Segments>,
    /// Held by a flush.
    flushing: Arc<std::sync::Mutex<()>>,
    /// Where the store is mirrored, when the experiment's storage is an
    /// object store (mirror.rs): set once, shared by every handle.
    mirror: Arc<std::sync::OnceLock<mirror::Mirror>>,
    /// The private copy a read-only store was opened from (last: removed
    /// after the database is closed).
    snapshot: Option<Arc<snapshot::Snapshot>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn series_key(trial_id: &str, n: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(trial_id.len() + 9);
    k.extend_from_slice(trial_id.as_bytes());
    k.push(0);
    k.extend_from_slice(&n.to_be_bytes());
    k
}

fn series_prefix(trial_id: &str) -> Vec<u8> {
    let mut k = trial_id.as_bytes().to_vec();
    k.push(0);
    k
}

/// sled's page cache. The loop writes and rarely reads back; a small cache
/// keeps the driver's memory from growing with the trials (1,000 trials of
/// the overhead benchmark: 17 MB either way; 10,000: 28-32 MB, against
/// 35-41 MB with 8 MiB of cache and sled's 512 KiB segments).
const CACHE_BYTES: u64 = 1 << 20;

/// The log segment size of a new store: sled buffers a segment in memory
/// per flush, and the loop flushes every group commit.
const SEGMENT_BYTES: usize = 1 << 16;

/// The segment size of the store at `path`: its own when it exists (sled
/// refuses another), else [`SEGMENT_BYTES`].
fn segment_size(path: &Path) -> usize {
    let conf = std::fs::read(path.join("conf")).unwrap_or_default();
    String::from_utf8_lossy(&conf)
        .lines()
        .find_map(|l| l.strip_prefix("segment_size: ").and_then(|n| n.trim().parse().ok()))
        .unwrap_or(SEGMENT_BYTES)
}

/// The searcher's key: its state, and the record of the trial suggested
/// with it (until a later save).
#[derive(Serialize)]
struct SavedSearcher<'a> {
    searcher_state: &'a Value,
    created: Option<&'a TrialRecord>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadedSearcher {
    searcher_state: Value,
    created: Option<TrialRecord>,
}

impl Store {
    /// Opens (creating if needed) the store at `path`. A lock still held
    /// for a moment by a store just closed (sled's flusher thread lets go
    /// shortly after the last handle) is waited for, up to a second.
    /// Nothing is flushed in the background: writes are durable at
    /// [`Store::flush`], which also writes the scheduler's journal.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_at(path, path)
    }

    /// Opens the store at `path` to read it, writing nothing there: a
    /// private copy of its files is opened (see snapshot.rs), so it works on
    /// a full disk and on a read-only copy of an experiment. Writes to it
    /// are lost with it. [`StoreError::Locked`] while a sweep holds it.
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        if !path.join("db").exists() {
            return Err(StoreError::Missing(path.to_path_buf()));
        }
        let (snapshot, copy) = snapshot::Snapshot::take(path)?;
        let mut store = Self::open_at(&copy, path)?;
        store.snapshot = Some(Arc::new(snapshot));
        Ok(store)
    }

    /// Opens the database in `dir`; errors name `path`.
    fn open_at(dir: &Path, path: &Path) -> Result<Self, StoreError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let db = loop {
            let opened =
                sled::Config::new().path(dir).cache_capacity(CACHE_BYTES).segment_size(segment_size(dir)).flush_every_ms(None).open();
            match opened {
                Ok(db) => break db,
                Err(sled::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("lock") => {
                    if std::time::Instant::now() >= deadline {
                        return Err(StoreError::Locked(path.to_path_buf()));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(source) => return Err(StoreError::Sled { path: path.to_path_buf(), source }),
            }
        };
        let tree = |name: &str| db.open_tree(name).map_err(|source| StoreError::Sled { path: path.to_path_buf(), source });
        Ok(Self {
            path: path.to_path_buf(),
            meta: tree("meta")?,
            trials: tree("trials")?,
            results: tree("results")?,
            checkpoints: tree("checkpoints")?,
            exploits: tree("exploits")?,
            segments: Arc::default(),
            flushing: Arc::default(),
            mirror: Arc::default(),
            db,
            snapshot: None,
        })
    }

    /// Whether nothing was ever made durable here: no key in any tree and
    /// no journal segment (what a driver killed before its first flush
    /// leaves).
    pub(crate) fn holds_nothing(&self) -> Result<bool, StoreError> {
        let trees = [&self.meta, &self.trials, &self.results, &self.checkpoints, &self.exploits];
        Ok(trees.iter().all(|t| t.is_empty()) && self.latest_journal()?.is_none())
    }

    /// Opens an existing store; an error when there is none.
    pub fn open_existing(path: &Path) -> Result<Self, StoreError> {
        if !path.join("conf").exists() && !path.join("db").exists() {
            return Err(StoreError::Missing(path.to_path_buf()));
        }
        Self::open(path)
    }

    fn sled_err(&self) -> impl Fn(sled::Error) -> StoreError + '_ {
        move |source| StoreError::Sled { path: self.path.clone(), source }
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
            path: self.path.clone(),
            key: String::from_utf8_lossy(key).replace('\0', "/"),
            message: e.to_string(),
        })
    }

    fn encode<T: Serialize>(value: &T) -> Vec<u8> {
        // Our records are plain data; serializing them cannot fail.
        serde_json::to_vec(value).unwrap_or_default()
    }

    /// Stores the resolved experiment file.
    pub fn put_experiment(&self, toml_text: &str) -> Result<(), StoreError> {
        self.put(0, b"experiment", toml_text.as_bytes().to_vec())?;
        Ok(())
    }

    /// The resolved experiment file.
    pub fn experiment(&self) -> Result<Option<String>, StoreError> {
        Ok(self.meta.get("experiment").map_err(self.sled_err())?.map(|v| String::from_utf8_lossy(&v).into_owned()))
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stores a meta value (e.g. the searcher's state).
    pub fn put_meta(&self, key: &str, value: &Value) -> Result<(), StoreError> {
        self.put(0, key.as_bytes(), Self::encode(value))?;
        Ok(())
    }

    /// Stores a meta value given as JSON text.
    pub(crate) fn put_meta_json(&self, key: &str, json: Vec<u8>) -> Result<(), StoreError> {
        self.put(0, key.as_bytes(), json)?;
        Ok(())
    }

    /// Queues a hook call for the scheduler's journal: written by the next
    /// flush, once the database is durable.
    pub(crate) fn push_journal(&self, call: Vec<u8>) {
        self.segments.push(Op::Call(call));
    }

    /// Queues a new journal segment, `generation`, starting with a snapshot
    /// of the scheduler's state (written by the next flush, like a call).
    pub(crate) fn push_snapshot(&self, generation: u64, snapshot: Vec<u8>) {
        self.segments.push(Op::Start { generation, snapshot });
    }

    /// Goes on writing the journal's segment `generation` (a resume).
    pub(crate) fn resume_journal(&self, generation: u64) -> Result<(), StoreError> {
        self.segments.resume(&self.path, generation).map_err(|e| self.io_err("journal", e))
    }

    /// The journal's latest segment with a whole snapshot: its generation
    /// and its records, the snapshot first.
    pub(crate) fn latest_journal(&self) -> Result<Option<Segment>, StoreError> {
        segments::latest(&self.path).map_err(|e| self.io_err("journal", e))
    }

    fn io_err(&self, what: &str, e: std::io::Error) -> StoreError {
        StoreError::Corrupt { path: self.path.clone(), key: what.into(), message: e.to_string() }
    }

    /// Reads a meta value.
    pub fn meta(&self, key: &str) -> Result<Option<Value>, StoreError> {
        match self.meta.get(key).map_err(self.sled_err())? {
            Some(v) => Ok(Some(self.decode(key.as_bytes(), &v)?)),
            None => Ok(None),
        }
    }

    /// Stores a new trial together with the searcher state after suggesting
    /// it, atomically: a resumed searcher never re-suggests or skips a
    /// trial. One write carries both (the searcher's key holds the new
    /// record too, [`Store::recover_created`] puts it back after a crash),
    /// so no multi-key batch forces a log write of its own per trial; the
    /// trial's own key is written after it.
    pub fn create_trial(&self, trial: &TrialRecord, searcher_state: &Value) -> Result<(), StoreError> {
        let saved = SavedSearcher { searcher_state, created: Some(trial) };
        self.put(0, b"searcher", Self::encode(&saved))?;
        self.put_trial(trial)
    }

    /// Stores the searcher's state.
    pub fn put_searcher(&self, searcher_state: &Value) -> Result<(), StoreError> {
        let saved = SavedSearcher { searcher_state, created: None };
        self.put(0, b"searcher", Self::encode(&saved))?;
        Ok(())
    }

    /// The searcher's latest state, and the trial created with it (if it was).
    fn saved_searcher(&self) -> Result<Option<(Value, Option<TrialRecord>)>, StoreError> {
        let Some(bytes) = self.meta.get("searcher").map_err(self.sled_err())? else { return Ok(None) };
        match serde_json::from_slice::<LoadedSearcher>(&bytes) {
            Ok(l) => Ok(Some((l.searcher_state, l.created))),
            // Stores written before the record rode along hold the bare state.
            Err(_) => Ok(Some((self.decode(b"searcher", &bytes)?, None))),
        }
    }

    /// The searcher's latest state.
    pub fn searcher(&self) -> Result<Option<Value>, StoreError> {
        Ok(self.saved_searcher()?.map(|(state, _)| state))
    }

    /// After a crash: writes the record of the trial created with the
    /// searcher's latest state, when the crash came between the two writes.
    /// True when it did.
    pub fn recover_created(&self) -> Result<bool, StoreError> {
        let Some((_, Some(created))) = self.saved_searcher()? else { return Ok(false) };
        if self.trials.contains_key(created.id.as_bytes()).map_err(self.sled_err())? {
            return Ok(false);
        }
        self.put_trial(&created)?;
        Ok(true)
    }

    /// Writes a trial's record.
    pub fn put_trial(&self, trial: &TrialRecord) -> Result<(), StoreError> {
        self.put(1, trial.id.as_bytes(), Self::encode(trial))?;
        Ok(())
    }

    /// One trial's record.
    pub fn trial(&self, id: &str) -> Result<Option<TrialRecord>, StoreError> {
        match self.trials.get(id).map_err(self.sled_err())? {
            Some(v) => Ok(Some(self.decode(id.as_bytes(), &v)?)),
            None => Ok(None),
        }
    }

    /// Every trial, in creation order.
    pub fn trials(&self) -> Result<Vec<TrialRecord>, StoreError> {
        let mut out = self.each_trial().collect::<Result<Vec<_>, _>>()?;
        out.sort_by_key(|t| t.index);
        Ok(out)
    }

    /// Every trial, one record at a time, in the order of their ids.
    pub fn each_trial(&self) -> impl Iterator<Item = Result<TrialRecord, StoreError>> + '_ {
        self.trials.iter().map(|kv| {
            let (k, v) = kv.map_err(self.sled_err())?;
            self.decode::<TrialRecord>(&k, &v)
        })
    }

    /// Deletes a trial: its record, results, checkpoint and exploit records
    /// (not the files they name). For a simulation that keeps only its best
    /// trials (`Tuner::keep_best`).
    pub fn remove_trial(&self, id: &str) -> Result<(), StoreError> {
        self.clear_series(id)?;
        self.remove(1, id.as_bytes())?;
        Ok(())
    }

    /// Deletes a trial's results, checkpoint and exploit rows (its record stays).
    pub fn clear_series(&self, id: &str) -> Result<(), StoreError> {
        let prefix = series_prefix(id);
        for (n, tree) in [(2, &self.results), (3, &self.checkpoints), (4, &self.exploits)] {
            let keys: Vec<sled::IVec> = tree.scan_prefix(&prefix).keys().collect::<Result<_, _>>().map_err(self.sled_err())?;
            for k in keys {
                self.remove(n, &k)?;
            }
        }
        Ok(())
    }

    /// Appends a result (its `seq` must be the trial's next sequence number).
    pub fn put_result(&self, result: &TrialResult) -> Result<(), StoreError> {
        self.put(2, &series_key(&result.trial_id, result.seq), Self::encode(result))?;
        Ok(())
    }

    /// Every stored result of a trial, in sequence order.
    pub fn results(&self, trial_id: &str) -> Result<Vec<TrialResult>, StoreError> {
        self.series(&self.results, trial_id)
    }

    /// One stored result of a trial.
    pub fn result(&self, trial_id: &str, seq: u64) -> Result<Option<TrialResult>, StoreError> {
        let key = series_key(trial_id, seq);
        match self.results.get(&key).map_err(self.sled_err())? {
            Some(v) => Ok(Some(self.decode(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// Every trial's results, in sequence order, keyed by trial id.
    pub fn all_results(&self) -> Result<HashMap<String, Vec<TrialResult>>, StoreError> {
        let mut out: HashMap<String, Vec<TrialResult>> = HashMap::new();
        for kv in self.results.iter() {
            let (k, v) = kv.map_err(self.sled_err())?;
            let r: TrialResult = self.decode(&k, &v)?;
            out.entry(r.trial_id.clone()).or_default().push(r);
        }
        Ok(out)
    }

    /// Every trial's results, a trial at a time in the order of their ids
    /// (as [`Store::each_trial`]), each in sequence order.
    pub fn each_trial_results(&self) -> Series<'_, TrialResult> {
        Series { store: self, iter: self.results.iter().peekable(), _of: std::marker::PhantomData }
    }

    /// Every trial's committed checkpoints, a trial at a time in the order
    /// of their ids, each oldest first.
    pub fn each_trial_checkpoints(&self) -> Series<'_, CheckpointRecord> {
        Series { store: self, iter: self.checkpoints.iter().peekable(), _of: std::marker::PhantomData }
    }

    /// Every trial's committed checkpoints, oldest first, keyed by trial id.
    pub fn all_checkpoints(&self) -> Result<HashMap<String, Vec<CheckpointRecord>>, StoreError> {
        let mut out: HashMap<String, Vec<CheckpointRecord>> = HashMap::new();
        for kv in self.checkpoints.iter() {
            let (k, v) = kv.map_err(self.sled_err())?;
            let id = k.split(|b| *b == 0).next().map(|id| String::from_utf8_lossy(id).into_owned()).unwrap_or_default();
            out.entry(id).or_default().push(self.decode(&k, &v)?);
        }
        Ok(out)
    }

    /// A trial's records in one series tree, in key order.
    fn series<T: serde::de::DeserializeOwned>(&self, tree: &sled::Tree, trial_id: &str) -> Result<Vec<T>, StoreError> {
        tree.scan_prefix(series_prefix(trial_id))
            .map(|kv| {
                let (k, v) = kv.map_err(self.sled_err())?;
                self.decode(&k, &v)
            })
            .collect()
    }

    /// Brings a trial record up to date with its results and checkpoints
    /// trees (the record itself is rewritten only when the trial starts or
    /// ends): result count, last result, latest checkpoint.
    pub fn refresh_trial(&self, trial: &mut TrialRecord) -> Result<(), StoreError> {
        if let Some(kv) = self.results.scan_prefix(series_prefix(&trial.id)).next_back() {
            let (k, v) = kv.map_err(self.sled_err())?;
            let last: TrialResult = self.decode(&k, &v)?;
            trial.num_results = last.seq + 1;
            trial.last_result = Some(last);
        }
        if let Some(kv) = self.checkpoints.scan_prefix(series_prefix(&trial.id)).next_back() {
            let (k, v) = kv.map_err(self.sled_err())?;
            trial.latest_checkpoint = Some(self.decode(&k, &v)?);
        }
        Ok(())
    }

    /// Records a committed checkpoint.
    pub fn put_checkpoint(&self, trial_id: &str, ckpt: &CheckpointRecord) -> Result<(), StoreError> {
        self.put(3, &series_key(trial_id, ckpt.iteration), Self::encode(ckpt))?;
        Ok(())
    }

    /// Uncommits a checkpoint (before its files are deleted).
    pub fn remove_checkpoint(&self, trial_id: &str, iteration: u64) -> Result<(), StoreError> {
        self.remove(3, &series_key(trial_id, iteration))?;
        Ok(())
    }

    /// A trial's committed checkpoints, oldest first.
    pub fn checkpoints(&self, trial_id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
        self.series(&self.checkpoints, trial_id)
    }

    /// Records an exploit carried out (keyed by recipient and `n`: one
    /// redone after a crash replaces its first record).
    pub fn put_exploit(&self, e: &ExploitRecord) -> Result<(), StoreError> {
        self.put(4, &series_key(&e.trial_id, u64::from(e.n)), Self::encode(e))?;
        Ok(())
    }

    /// Every exploit carried out, in the order they happened.
    pub fn exploits(&self) -> Result<Vec<ExploitRecord>, StoreError> {
        let mut all: Vec<ExploitRecord> =
            self.exploits.iter().map(|kv| kv.map_err(self.sled_err()).and_then(|(k, v)| self.decode(&k, &v))).collect::<Result<_, _>>()?;
        all.sort_by(|a, b| a.at.total_cmp(&b.at).then_with(|| a.trial_id.cmp(&b.trial_id)));
        Ok(all)
    }

    /// Makes every write so far durable (fsync), then writes the journal
    /// calls made before it started (see segments.rs). One flush at a
    /// time, so the journal keeps the order of its calls. A mirrored store
    /// then uploads what changed since the last flush (mirror.rs): a flush
    /// returns once the object store holds it too.
    pub fn flush(&self) -> Result<(), StoreError> {
        let _one = self.flushing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let journal = self.segments.take();
        let changes = self.mirror.get().map(|m| m.take(&journal));
        self.db.flush().map_err(self.sled_err())?;
        if !journal.is_empty() && self.snapshot.is_none() {
            self.segments.write(&self.path, journal).map_err(|e| self.io_err("journal", e))?;
        }
        if let (Some(m), Some(changes)) = (self.mirror.get(), changes) {
            let uploaded = m.upload(changes, || self.dump().unwrap_or_default()).map_err(|e| self.mirror_err(e))?;
            if let Some(seq) = uploaded {
                let _ = std::fs::write(self.path.join("mirror-seq"), seq.to_string());
            }
        }
        Ok(())
    }

    /// Makes every write so far durable on this machine (fsync, the
    /// journal written), without waiting on the object store a mirrored
    /// store uploads to: what changed goes up with the next
    /// [`Store::flush`], which the loop runs off its own task. What the
    /// loop itself calls: an acknowledgement needs this machine's disk only,
    /// and nothing on the loop waits on a bucket.
    pub fn flush_local(&self) -> Result<(), StoreError> {
        let _one = self.flushing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let journal = self.segments.take();
        if let Some(m) = self.mirror.get() {
            m.defer(&journal);
        }
        self.db.flush().map_err(self.sled_err())?;
        if !journal.is_empty() && self.snapshot.is_none() {
            self.segments.write(&self.path, journal).map_err(|e| self.io_err("journal", e))?;
        }
        Ok(())
    }

    /// Writes `value` at `key` of tree `n` (of [`mirror::TREES`]), recorded for the mirror.
    fn put(&self, n: u8, key: &[u8], value: Vec<u8>) -> Result<(), StoreError> {
        self.tree(n).insert(key, value.as_slice()).map_err(self.sled_err())?;
        if let Some(m) = self.mirror.get() {
            m.record(mirror::Change::Put { tree: n, key: key.to_vec(), value });
        }
        Ok(())
    }

    /// Removes `key` of tree `n`, recorded for the mirror.
    fn remove(&self, n: u8, key: &[u8]) -> Result<(), StoreError> {
        self.tree(n).remove(key).map_err(self.sled_err())?;
        if let Some(m) = self.mirror.get() {
            m.record(mirror::Change::Remove { tree: n, key: key.to_vec() });
        }
        Ok(())
    }

    fn tree(&self, n: u8) -> &sled::Tree {
        match n {
            0 => &self.meta,
            1 => &self.trials,
            2 => &self.results,
            3 => &self.checkpoints,
            _ => &self.exploits,
        }
    }

    fn mirror_err(&self, e: trainer::StorageError) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            key: "mirror".into(),
            message: format!("could not copy the store to its object store: {e}"),
        }
    }

    /// The whole store as changes: every record, and the journal's latest segment.
    fn dump(&self) -> Result<Vec<mirror::Change>, StoreError> {
        let mut out = Vec::new();
        for n in 0..mirror::TREES.len() as u8 {
            for kv in self.tree(n).iter() {
                let (k, v) = kv.map_err(self.sled_err())?;
                out.push(mirror::Change::Put { tree: n, key: k.to_vec(), value: v.to_vec() });
            }
        }
        if let Some((generation, records)) = self.latest_journal()? {
            let mut records = records.into_iter();
            if let Some(snapshot) = records.next() {
                out.push(mirror::Change::Start { generation, snapshot });
                out.extend(records.map(mirror::Change::Call));
            }
        }
        Ok(out)
    }

    /// Mirrors the store to `storage` from now on (mirror.rs): the whole
    /// store is written there first, as a base the logs of later flushes
    /// follow.
    pub async fn mirror_to(&self, storage: &trainer::Storage) -> Result<(), StoreError> {
        let seq = mirror::next_seq(storage).await.map_err(|e| self.mirror_err(e))?;
        // Flushed first: the base holds what the local store holds durably, and nothing waits in the journal.
        self.flush()?;
        let all = self.dump()?;
        mirror::write_base(storage, seq, &all).await.map_err(|e| self.mirror_err(e))?;
        let m = mirror::Mirror::new(storage.clone(), seq + 1).map_err(|e| self.io_err("mirror", e))?;
        let _ = std::fs::write(self.path.join("mirror-seq"), seq.to_string());
        let _ = self.mirror.set(m);
        Ok(())
    }

    /// Reads the store mirrored at `storage` back into a new store at
    /// `path` (what was there is replaced): its latest base and the logs
    /// after it, replayed in order. Errors when `storage` holds none.
    pub async fn materialize(storage: &trainer::Storage, path: &Path) -> Result<Self, StoreError> {
        let (changes, next) = mirror::read_all(storage).await.map_err(|message| StoreError::Corrupt {
            path: path.to_path_buf(),
            key: storage.uri(""),
            message,
        })?;
        if next == 0 {
            return Err(StoreError::Missing(PathBuf::from(storage.uri(""))));
        }
        if path.exists() {
            std::fs::remove_dir_all(path).map_err(|e| StoreError::Corrupt {
                path: path.to_path_buf(),
                key: "store".into(),
                message: e.to_string(),
            })?;
        }
        let store = Self::open(path)?;
        let mut journal = Vec::new();
        for c in changes {
            match c {
                mirror::Change::Put { tree, key, value } => {
                    store.tree(tree).insert(key, value).map_err(store.sled_err())?;
                }
                mirror::Change::Remove { tree, key } => {
                    store.tree(tree).remove(key).map_err(store.sled_err())?;
                }
                mirror::Change::Call(bytes) => journal.push(Op::Call(bytes)),
                mirror::Change::Start { generation, snapshot } => journal.push(Op::Start { generation, snapshot }),
            }
        }
        store.db.flush().map_err(store.sled_err())?;
        if !journal.is_empty() {
            store.segments.write(&store.path, journal).map_err(|e| store.io_err("journal", e))?;
        }
        let _ = std::fs::write(path.join("mirror-seq"), (next - 1).to_string());
        Ok(store)
    }

    /// How far the local store's mirror went (`None`: not mirrored here).
    pub fn mirrored_seq(path: &Path) -> Option<u64> {
        mirror::local_seq(path)
    }

    /// The number the next log of the store mirrored at `storage` takes.
    pub async fn mirror_next(storage: &trainer::Storage) -> Result<u64, trainer::StorageError> {
        mirror::next_seq(storage).await
    }
}

/// A series tree read a trial at a time: `(trial id, its records)`.
pub struct Series<'a, T> {
    store: &'a Store,
    iter: std::iter::Peekable<sled::Iter>,
    _of: std::marker::PhantomData<T>,
}

impl<T> Series<'_, T> {
    /// The id of the next trial this series holds records of.
    fn next_id(&mut self) -> Option<Vec<u8>> {
        match self.iter.peek()? {
            Ok((k, _)) => Some(k.split(|b| *b == 0).next().unwrap_or_default().to_vec()),
            Err(_) => Some(Vec::new()),
        }
    }
}

impl<T: serde::de::DeserializeOwned> Series<'_, T> {
    /// The records of `trial_id` (none when it has none): the records of
    /// trials before it, in id order, are passed over.
    pub fn of(&mut self, trial_id: &str) -> Result<Vec<T>, StoreError> {
        while self.next_id().is_some_and(|id| id.as_slice() < trial_id.as_bytes()) {
            self.iter.next().transpose().map_err(self.store.sled_err())?;
        }
        Ok(if self.next_id().is_some_and(|id| id == trial_id.as_bytes()) {
            self.next().transpose()?.map(|(_, records)| records).unwrap_or_default()
        } else {
            Vec::new()
        })
    }
}

impl<T: serde::de::DeserializeOwned> Iterator for Series<'_, T> {
    type Item = Result<(String, Vec<T>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let id = self.next_id()?;
        let mut records = Vec::new();
        while self.next_id().is_some_and(|next| next == id) {
            let decoded = match self.iter.next()? {
                Ok((k, v)) => self.store.decode(&k, &v),
                Err(e) => Err((self.store.sled_err())(e)),
            };
            match decoded {
                Ok(r) => records.push(r),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok((String::from_utf8_lossy(&id).into_owned(), records)))
    }
}

/// A trial's effective metric history: its results with those superseded by a
/// restart removed. A trial restarted from the checkpoint of iteration `k`
/// reports `k+1, k+2, ...` again; results of the earlier run past `k` stay in
/// the store (nothing acknowledged is deleted) but are replaced here by the
/// later run's.
pub fn effective_history(results: Vec<TrialResult>) -> Vec<TrialResult> {
    let mut keep: Vec<TrialResult> = Vec::with_capacity(results.len());
    let mut min_iter = u64::MAX;
    for r in results.into_iter().rev() {
        if r.training_iteration < min_iter {
            min_iter = r.training_iteration;
            keep.push(r);
        }
    }
    keep.reverse();
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(trial: &str, seq: u64, iter: u64, loss: f64) -> TrialResult {
        TrialResult {
            extra: None,
            trial_id: trial.into(),
            seq,
            training_iteration: iter,
            metrics: [("loss".to_string(), loss)].into_iter().collect(),
            checkpoint: None,
        }
    }

    #[test]
    fn series_read_a_trial_at_a_time_in_id_order_pass_over_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        // Ids that do not sort as they were created, and results of trials with no record.
        for (index, id) in ["t1", "t2", "t10"].into_iter().enumerate() {
            store.put_trial(&TrialRecord::new(id.into(), index as u64, serde_json::json!({}), 0.0)).unwrap();
        }
        for (id, n) in [("t0", 2), ("t1", 2), ("t10", 1), ("t2", 3), ("t3", 1)] {
            for seq in 0..n {
                store.put_result(&result(id, seq, seq + 1, seq as f64)).unwrap();
            }
        }
        let ckpt =
            CheckpointRecord { version: 1, iteration: 1, uri: "c".into(), ranks: vec![0], world_size: 1, metrics: Default::default() };
        store.put_checkpoint("t10", &ckpt).unwrap();
        let ids: Vec<String> = store.each_trial().map(|t| t.unwrap().id).collect();
        assert_eq!(ids, ["t1", "t10", "t2"]);
        let (mut results, mut checkpoints) = (store.each_trial_results(), store.each_trial_checkpoints());
        let seqs = |r: Vec<TrialResult>| r.iter().map(|r| r.seq).collect::<Vec<_>>();
        assert_eq!(seqs(results.of("t1").unwrap()), [0, 1]);
        assert_eq!(checkpoints.of("t1").unwrap().len(), 0);
        assert_eq!(seqs(results.of("t10").unwrap()), [0]);
        assert_eq!(checkpoints.of("t10").unwrap(), [ckpt]);
        assert_eq!(seqs(results.of("t2").unwrap()), [0, 1, 2]);
        assert_eq!(seqs(results.of("t4").unwrap()), Vec::<u64>::new());
        // The grid holds the trials in creation order, each with its own history.
        let grid = crate::ResultGrid::from_store(dir.path(), &store).unwrap();
        let got: Vec<(String, usize)> = grid.iter().map(|t| (t.trial_id.clone(), t.history.len())).collect();
        assert_eq!(got, [("t1".to_string(), 2), ("t2".into(), 3), ("t10".into(), 1)]);
    }

    #[test]
    fn a_read_only_store_is_a_private_copy_refused_while_a_sweep_holds_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        assert!(matches!(Store::open_read_only(&path), Err(StoreError::Missing(_))));
        let store = Store::open(&path).unwrap();
        store.put_result(&result("t0", 0, 1, 0.5)).unwrap();
        store.flush().unwrap();
        assert!(matches!(Store::open_read_only(&path), Err(StoreError::Locked(p)) if p == path));
        drop(store);
        let before: Vec<_> = std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()).collect();
        let copy = Store::open_read_only(&path).unwrap();
        assert_eq!(copy.results("t0").unwrap().len(), 1);
        // What is written to the copy stays there; the copy goes with its last handle.
        copy.put_result(&result("t0", 1, 2, 0.4)).unwrap();
        copy.flush().unwrap();
        let private = copy.snapshot.as_ref().unwrap().dir.clone();
        assert!(private.exists());
        let after: Vec<_> = std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(before, after);
        // While a copy is open, a sweep may open the store.
        let store = Store::open(&path).unwrap();
        assert_eq!(store.results("t0").unwrap().len(), 1);
        drop(copy);
        assert!(!private.exists());
    }

    #[test]
    fn a_trial_created_with_the_searchers_state_survives_a_crash_between_the_writes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let state = serde_json::json!({ "suggested": 1 });
        let first = TrialRecord::new("t0".into(), 0, serde_json::json!({ "x": 1 }), 0.0);
        store.create_trial(&first, &state).unwrap();
        assert_eq!(store.searcher().unwrap(), Some(state));
        assert!(!store.recover_created().unwrap(), "both writes landed: nothing to do");
        // The driver died after the searcher's key was written, before the trial's.
        let second = TrialRecord::new("t1".into(), 1, serde_json::json!({ "x": 2 }), 0.0);
        let state = serde_json::json!({ "suggested": 2 });
        let saved = SavedSearcher { searcher_state: &state, created: Some(&second) };
        store.meta.insert("searcher", Store::encode(&saved)).unwrap();
        assert_eq!(store.trial("t1").unwrap(), None);
        assert!(store.recover_created().unwrap());
        assert_eq!(store.trial("t1").unwrap(), Some(second));
        assert_eq!(store.searcher().unwrap(), Some(state));
        // A later save of the state alone; and a store written before the record rode along.
        store.put_searcher(&serde_json::json!([3])).unwrap();
        assert_eq!(store.searcher().unwrap(), Some(serde_json::json!([3])));
        assert!(!store.recover_created().unwrap());
        store.put_meta("searcher", &serde_json::json!({ "rng": [1, 2] })).unwrap();
        assert_eq!(store.searcher().unwrap(), Some(serde_json::json!({ "rng": [1, 2] })));
        assert_eq!(store.trials().unwrap().len(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_local_flush_waits_on_no_mirror_and_the_next_flush_uploads_what_it_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let bucket = trainer::Storage::local(dir.path().join("bucket"));
        store.mirror_to(&bucket).await.unwrap();
        store.push_snapshot(1, vec![7]);
        store.put_result(&result("t0", 0, 1, 0.5)).unwrap();
        store.push_journal(vec![1, 2]);
        let s = store.clone();
        tokio::task::spawn_blocking(move || s.flush_local()).await.unwrap().unwrap();
        // Durable here, and not in the mirror yet.
        let copy = dir.path().join("copy");
        let mirrored = Store::materialize(&bucket, &copy).await.unwrap();
        assert!(mirrored.results("t0").unwrap().is_empty());
        drop(mirrored);
        store.put_result(&result("t0", 1, 2, 0.4)).unwrap();
        store.push_journal(vec![3]);
        let s = store.clone();
        tokio::task::spawn_blocking(move || s.flush()).await.unwrap().unwrap();
        // The next flush took up what the local one kept, the journal's calls in their order.
        let mirrored = Store::materialize(&bucket, &copy).await.unwrap();
        assert_eq!(mirrored.results("t0").unwrap().len(), 2);
        let (generation, records) = mirrored.latest_journal().unwrap().unwrap();
        assert_eq!((generation, records), (1, vec![vec![7], vec![1, 2], vec![3]]));
    }

    #[test]
    fn results_are_a_prefix_scan_in_sequence_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        // Ids that are prefixes of each other must not mix.
        for seq in (0..300).rev() {
            store.put_result(&result("t1", seq, seq + 1, seq as f64)).unwrap();
            store.put_result(&result("t10", seq, seq + 1, -(seq as f64))).unwrap();
        }
        store.flush().unwrap();
        drop(store);
        let store = Store::open_existing(&dir.path().join("store")).unwrap();
        let r = store.results("t1").unwrap();
        assert_eq!(r.len(), 300);
        assert!(r.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
        assert!(r.iter().all(|x| x.metrics["loss"] >= 0.0));
        assert!(Store::open_existing(&dir.path().join("nothing")).is_err());
    }

    #[test]
    fn a_store_written_with_another_segment_size_opens_with_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        // As stores were written before nestor chose its segment size: sled's default.
        let db = sled::Config::new().path(&path).segment_size(1 << 19).open().unwrap();
        db.open_tree("trials").unwrap().insert("t", &b"{}"[..]).unwrap();
        db.flush().unwrap();
        drop(db);
        assert_eq!(segment_size(&path), 1 << 19);
        let store = Store::open_existing(&path).unwrap();
        store.put_result(&result("t", 0, 1, 1.0)).unwrap();
        store.flush().unwrap();
        // A new store gets nestor's.
        let fresh = dir.path().join("fresh");
        drop(Store::open(&fresh).unwrap());
        assert_eq!(segment_size(&fresh), SEGMENT_BYTES);
    }

    #[test]
    fn refresh_brings_a_stale_record_up_to_date() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let mut rec = TrialRecord::new("t".into(), 0, serde_json::json!({}), 0.0);
        store.put_trial(&rec).unwrap();
        for seq in 0..5 {
            store.put_result(&result("t", seq, seq + 1, seq as f64)).unwrap();
        }
        store.put_result(&result("t0", 0, 1, 9.0)).unwrap();
        store
            .put_checkpoint(
                "t",
                &CheckpointRecord {
                    version: 1,
                    iteration: 2,
                    uri: "c2".into(),
                    ranks: vec![0],
                    world_size: 1,
                    metrics: Default::default(),
                },
            )
            .unwrap();
        store
            .put_checkpoint(
                "t",
                &CheckpointRecord {
                    version: 1,
                    iteration: 4,
                    uri: "c4".into(),
                    ranks: vec![0],
                    world_size: 1,
                    metrics: Default::default(),
                },
            )
            .unwrap();
        store.refresh_trial(&mut rec).unwrap();
        assert_eq!(rec.num_results, 5);
        assert_eq!(rec.last_result.unwrap().training_iteration, 5);
        assert_eq!(rec.latest_checkpoint.unwrap().iteration, 4);
        // Records written before ranks and metrics were kept still read.
        let old: CheckpointRecord = serde_json::from_str(r#"{"version":1,"iteration":3,"path":"/x/checkpoint_000003"}"#).unwrap();
        assert_eq!((old.uri.as_str(), old.ranks.as_slice(), old.world_size), ("/x/checkpoint_000003", &[0][..], 1));
        assert_eq!(old.required_world_size(), None);
    }

    #[test]
    fn history_drops_results_superseded_by_a_restart() {
        // Run 1 reached iteration 5; run 2 restarted from the checkpoint at 3.
        let mut rs: Vec<TrialResult> = (1..=5).map(|i| result("t", i - 1, i, 10.0 + i as f64)).collect();
        rs.extend((4..=6).map(|i| result("t", i + 1, i, 20.0 + i as f64)));
        let h = effective_history(rs);
        let iters: Vec<u64> = h.iter().map(|r| r.training_iteration).collect();
        assert_eq!(iters, [1, 2, 3, 4, 5, 6]);
        assert_eq!(h[3].metrics["loss"], 24.0);
    }
}
