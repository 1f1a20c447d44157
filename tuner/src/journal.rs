//! The scheduler's journal: every hook call the loop makes is recorded,
//! and the scheduler's whole state is written only now and then (a
//! snapshot). A resume restores the latest snapshot and replays the calls
//! made after it, in order, so the scheduler is where it was when the
//! driver died; then it is told what the store holds beyond that (see
//! `Tuner`'s resume).
//!
//! A snapshot is O(trials) for ASHA, HyperBand, the median rule and PBT;
//! writing one after every batch made a sweep quadratic in its trials. A
//! call is O(1): a view of the trial (its config only when the journal has
//! not named it since the snapshot) and a reference to the stored result.
//! A snapshot is taken once the calls since the last one outgrow twice the
//! last snapshot's size, so its cost is amortized over the calls it
//! replaces, and a resume replays at most that much.
//!
//! Calls wait here until the loop releases them, once it has stored what
//! they led to (a result's decision is written into its trial's record
//! right after the call); then they go to the store, which writes them to
//! a file of its own after each flush (store/segments.rs). So the journal
//! never holds a call whose consequences the database could have lost.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use schedulers::{Capacity, Decision, Exploit, Paused, Scheduler, TrialStatus, TrialView};
use search::{Config, TrialResult};

use crate::store::{Store, StoreError};
use crate::TuneError;

/// The calls since the latest snapshot may grow to this size, or to twice
/// the snapshot's, whichever is larger.
const MIN_JOURNAL_BYTES: usize = 256 << 10;

/// Version of the snapshot record. Version 1 (in `meta`, written after
/// every batch, no journal) is still read.
const SNAPSHOT_VERSION: u64 = 2;

/// A trial as a hook saw it. The config is left out when the journal named
/// this trial with the same config since the latest snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct View {
    id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<Config>,
    status: TrialStatus,
    num_results: u64,
    num_workers: u32,
}

/// The paused list a `choose_trial_to_run` call saw, as pieces of the list
/// the previous call saw (most calls differ by a trial or two).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Piece {
    /// `len` trials of the previous list, from index `from`.
    Kept { from: usize, len: usize },
    /// A trial the previous list did not hold like this.
    New(View),
}

/// One hook call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
enum Call {
    Add {
        trial: View,
    },
    /// The result is the stored one: `trial`'s result number `seq`.
    Result {
        trial: View,
        seq: u64,
    },
    Complete {
        trial: View,
        seq: Option<u64>,
    },
    Error {
        trial: View,
    },
    /// `chose`: the trial's id (before, its place in the list).
    Choose {
        paused: Vec<Piece>,
        can_add: bool,
        chose: Option<Value>,
    },
    NoMore,
    /// `take_stopped` gave up on these trials.
    TakeStopped {
        trials: Vec<String>,
    },
    /// `take_exploits` gave exploits of these (paused) trials.
    TakeExploits {
        trials: Vec<String>,
    },
    Capacity {
        capacity: Capacity,
    },
    /// A trial ended without a hook (one the scheduler gave up on).
    Forget {
        trial: String,
    },
}

/// What the scheduler has been told about the trials, saved with its state.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Told {
    /// For each live trial (added, not ended), how many of its results it has seen.
    seen: HashMap<String, u64>,
    /// How many trials it was told of with `on_trial_add` (they are added
    /// in creation order); `None` for a state saved before this was kept.
    added: Option<u64>,
}

/// The journal's writing side.
struct Log {
    /// Bytes of the calls since the latest snapshot.
    bytes: usize,
    /// The latest snapshot's size.
    snapshot_bytes: usize,
    /// The latest snapshot's generation.
    generation: u64,
    /// Each trial the journal named since the latest snapshot, with the
    /// config it gave (a view leaves out a config already given).
    configs: HashMap<String, Config>,
    /// Calls made and not yet released to the store.
    held: Vec<Vec<u8>>,
    /// The paused list the latest `Choose` since the snapshot saw, with
    /// each trial's config.
    paused: Vec<(View, Config)>,
    /// The calls since the latest snapshot may grow to this many bytes, or
    /// to twice the snapshot's size.
    min_bytes: usize,
}

/// The loop's scheduler: each hook call is journaled (see the module's
/// documentation), and what the scheduler was told of the trials is kept
/// for the resume.
pub(crate) struct Journaled {
    scheduler: Box<dyn Scheduler>,
    store: Store,
    /// `None` when nothing is written before the end (a replay of curves).
    log: Option<Log>,
    told: Told,
}

impl Journaled {
    /// A new sweep's scheduler. Without `journal`, nothing is written
    /// before [`Journaled::finish`].
    pub(crate) fn new(scheduler: Box<dyn Scheduler>, store: &Store, journal: bool) -> Self {
        let told = Told { added: Some(0), ..Told::default() };
        let mut j = Self { scheduler, store: store.clone(), log: journal.then(|| Log::new(0)), told };
        j.write_snapshot();
        j
    }

    /// A resumed sweep's scheduler: the latest snapshot restored and the
    /// calls journaled after it replayed.
    pub(crate) fn resume(mut scheduler: Box<dyn Scheduler>, store: &Store, journal: bool) -> Result<Self, TuneError> {
        let corrupt = |msg: String| TuneError::Corrupt(store.path().to_path_buf(), format!("scheduler state: {msg}"));
        // The journal's latest segment; a store without one (written before
        // the journal, or by a replay of curves) has its state in `meta`.
        let (generation, snapshot, calls) = match store.latest_journal()? {
            Some((generation, mut records)) => {
                let snapshot: Value =
                    serde_json::from_slice(&records.remove(0)).map_err(|e| corrupt(format!("snapshot {generation}: {e}")))?;
                (Some(generation), Some(snapshot), records)
            }
            None => (None, store.meta("scheduler")?, Vec::new()),
        };
        let mut told = Told { added: Some(0), ..Told::default() };
        if let Some(saved) = snapshot {
            let state = saved.get("scheduler").unwrap_or(&saved);
            scheduler.restore(state).map_err(|e| corrupt(e.to_string()))?;
            told = Told::deserialize(&saved).map_err(|e| corrupt(e.to_string()))?;
        }
        let mut replay = Replay { store, configs: HashMap::new(), paused: Vec::new() };
        for (n, bytes) in calls.iter().enumerate() {
            let call: Call = serde_json::from_slice(bytes).map_err(|e| corrupt(format!("journal call {n}: {e}")))?;
            replay.apply(&mut *scheduler, &mut told, call).map_err(|e| match e {
                ReplayError::Store(e) => TuneError::Store(e),
                ReplayError::Corrupt(msg) => corrupt(format!("journal call {n}: {msg}")),
            })?;
        }
        if !calls.is_empty() {
            tracing::info!(calls = calls.len(), "replayed the scheduler's journal");
        }
        let log = match (journal, generation) {
            (true, Some(generation)) => {
                // Calls go on in the segment the replay read.
                store.resume_journal(generation)?;
                let mut log = Log::new(generation);
                log.bytes = calls.iter().map(Vec::len).sum();
                log.configs = replay.configs;
                log.paused = replay.paused;
                Some(log)
            }
            (true, None) => Some(Log::new(0)),
            (false, _) => None,
        };
        let mut j = Self { scheduler, store: store.clone(), log, told };
        if generation.is_none() {
            j.write_snapshot();
        }
        Ok(j)
    }

    /// The scheduler, for what it declares (required metrics, pausing).
    pub(crate) fn scheduler(&self) -> &dyn Scheduler {
        &*self.scheduler
    }

    /// How many of `trial`'s results the scheduler has seen.
    pub(crate) fn seen(&self, trial: &str) -> u64 {
        self.told.seen.get(trial).copied().unwrap_or(0)
    }

    /// Whether the scheduler counts `trial` as live (told of it, not of its end).
    pub(crate) fn is_live(&self, trial: &str) -> bool {
        self.told.seen.contains_key(trial)
    }

    /// How many trials, in creation order, the scheduler was told of;
    /// `None` when the saved state does not say.
    pub(crate) fn added(&self) -> Option<u64> {
        self.told.added
    }

    pub(crate) fn on_trial_add(&mut self, trial: &TrialView<'_>) -> Result<(), TuneError> {
        self.write(|log| Call::Add { trial: log.view(trial) });
        self.told.seen.entry(trial.id.to_string()).or_insert(0);
        self.told.added = self.told.added.map(|n| n + 1);
        self.scheduler.on_trial_add(trial);
        Ok(())
    }

    pub(crate) fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Result<Decision, TuneError> {
        self.write(|log| Call::Result { trial: log.view(trial), seq: result.seq });
        self.told.seen.insert(trial.id.to_string(), result.seq + 1);
        Ok(self.scheduler.on_trial_result(trial, result))
    }

    pub(crate) fn on_trial_complete(&mut self, trial: &TrialView<'_>, result: Option<&TrialResult>) -> Result<(), TuneError> {
        self.write(|log| {
            let call = Call::Complete { trial: log.view(trial), seq: result.map(|r| r.seq) };
            log.configs.remove(trial.id);
            call
        });
        self.told.seen.remove(trial.id);
        self.scheduler.on_trial_complete(trial, result);
        Ok(())
    }

    pub(crate) fn on_trial_error(&mut self, trial: &TrialView<'_>) -> Result<(), TuneError> {
        self.write(|log| {
            let call = Call::Error { trial: log.view(trial) };
            log.configs.remove(trial.id);
            call
        });
        self.told.seen.remove(trial.id);
        self.scheduler.on_trial_error(trial);
        Ok(())
    }

    /// A journaled choice records the paused list, a pass over it; a
    /// replay of curves journals nothing, so its choices cost what the
    /// scheduler makes them cost.
    pub(crate) fn choose_trial_to_run(&mut self, paused: &dyn Paused, can_add: bool) -> Result<Option<String>, TuneError> {
        let chose = self.scheduler.choose_trial_to_run(paused, can_add);
        self.write(|log| {
            let views: Vec<TrialView<'_>> = paused.iter().collect();
            Call::Choose { paused: log.pieces(&views), can_add, chose: chose.clone().map(Value::String) }
        });
        Ok(chose)
    }

    pub(crate) fn on_no_more_trials(&mut self) -> Result<(), TuneError> {
        self.write(|_| Call::NoMore);
        self.scheduler.on_no_more_trials();
        Ok(())
    }

    pub(crate) fn take_stopped(&mut self) -> Result<Vec<String>, TuneError> {
        let trials = self.scheduler.take_stopped();
        if !trials.is_empty() {
            self.write(|_| Call::TakeStopped { trials: trials.clone() });
        }
        Ok(trials)
    }

    pub(crate) fn take_exploits(&mut self) -> Result<Vec<Exploit>, TuneError> {
        let exploits = self.scheduler.take_exploits();
        if !exploits.is_empty() {
            self.write(|_| Call::TakeExploits { trials: exploits.iter().map(|e| e.trial_id.clone()).collect() });
        }
        Ok(exploits)
    }

    pub(crate) fn on_capacity(&mut self, capacity: Capacity) -> Result<(), TuneError> {
        self.write(|_| Call::Capacity { capacity });
        self.scheduler.on_capacity(capacity);
        Ok(())
    }

    /// A trial ended without a hook (the scheduler gave up on it itself):
    /// it is not live any more.
    pub(crate) fn forget(&mut self, trial: &str) {
        if self.told.seen.remove(trial).is_some() {
            self.write(|log| {
                log.configs.remove(trial);
                Call::Forget { trial: trial.to_string() }
            });
        }
    }

    /// Hands the calls made so far to the store (its next flush writes
    /// them). The loop calls it once everything those calls led to is
    /// stored: before it starts a flush.
    pub(crate) fn release(&mut self) {
        if let Some(log) = &mut self.log {
            for call in log.held.drain(..) {
                self.store.push_journal(call);
            }
        }
    }

    /// Takes a snapshot when the calls since the last one have outgrown
    /// their share. Called after each batch.
    pub(crate) fn maintain(&mut self) {
        if self.log.as_ref().is_some_and(|log| log.bytes >= log.min_bytes.max(2 * log.snapshot_bytes)) {
            self.write_snapshot();
        }
    }

    /// The sweep's end: a last snapshot, and the state in `meta` for
    /// those who read the store (a replay of curves writes only this).
    pub(crate) fn finish(&mut self) -> Result<(), TuneError> {
        if self.log.as_ref().is_some_and(|log| log.bytes > 0) {
            self.write_snapshot();
        }
        self.store.put_meta_json("scheduler", self.state())?;
        Ok(())
    }

    /// The scheduler's whole state and what it was told, as JSON text
    /// (written without a `Value` of the whole: see `Scheduler::save_json`).
    fn state(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Snapshot<'a> {
            version: u64,
            scheduler: &'a serde_json::value::RawValue,
            #[serde(flatten)]
            told: &'a Told,
        }
        let scheduler = String::from_utf8(self.scheduler.save_json()).ok().and_then(|s| serde_json::value::RawValue::from_string(s).ok());
        let scheduler = scheduler.unwrap_or_else(|| {
            tracing::warn!("the scheduler's state is not JSON; saving it as null");
            serde_json::value::RawValue::from_string("null".into()).unwrap_or_default()
        });
        serde_json::to_vec(&Snapshot { version: SNAPSHOT_VERSION, scheduler: &scheduler, told: &self.told }).unwrap_or_default()
    }

    /// Starts a new journal segment with the scheduler's whole state.
    fn write_snapshot(&mut self) {
        if self.log.is_none() {
            return;
        }
        // The calls it covers go first, into the segment it ends.
        self.release();
        let bytes = self.state();
        let Some(log) = &mut self.log else { return };
        log.generation += 1;
        log.snapshot_bytes = bytes.len();
        log.bytes = 0;
        log.configs.clear();
        log.paused.clear();
        self.store.push_snapshot(log.generation, bytes);
    }

    fn write(&mut self, call: impl FnOnce(&mut Log) -> Call) {
        let Some(log) = &mut self.log else { return };
        let bytes = serde_json::to_vec(&call(log)).unwrap_or_default();
        log.bytes += bytes.len();
        log.held.push(bytes);
    }
}

impl Log {
    /// A log whose latest snapshot is `generation` (the next is one more).
    fn new(generation: u64) -> Self {
        Self {
            bytes: 0,
            snapshot_bytes: 0,
            generation,
            configs: HashMap::new(),
            paused: Vec::new(),
            held: Vec::new(),
            min_bytes: MIN_JOURNAL_BYTES,
        }
    }

    fn view(&mut self, trial: &TrialView<'_>) -> View {
        name(&mut self.configs, trial)
    }

    /// `paused` as pieces of the list the previous `Choose` saw.
    fn pieces(&mut self, paused: &[TrialView<'_>]) -> Vec<Piece> {
        let before: HashMap<&str, usize> = self.paused.iter().enumerate().map(|(i, (v, _))| (v.id.as_str(), i)).collect();
        let mut pieces: Vec<Piece> = Vec::new();
        let mut kept_at = Vec::with_capacity(paused.len());
        for p in paused {
            let kept = before.get(p.id).copied().filter(|&i| {
                let (old, config) = &self.paused[i];
                old.status == p.status && old.num_results == p.num_results && old.num_workers == p.num_workers && config == p.config
            });
            kept_at.push(kept);
            match (kept, pieces.last_mut()) {
                (Some(i), Some(Piece::Kept { from, len })) if *from + *len == i => *len += 1,
                (Some(i), _) => pieces.push(Piece::Kept { from: i, len: 1 }),
                (None, _) => {}
            }
            if kept.is_none() {
                pieces.push(Piece::New(name(&mut self.configs, p)));
            }
        }
        drop(before);
        self.paused = paused
            .iter()
            .zip(kept_at)
            .map(|(p, kept)| match kept {
                Some(i) => self.paused[i].clone(),
                None => (View { config: None, ..owned(p) }, p.config.clone()),
            })
            .collect();
        pieces
    }
}

/// `trial` as an entry names it: with its config the first time since the
/// snapshot, or when it changed (`configs` holds the ones given).
fn name(configs: &mut HashMap<String, Config>, trial: &TrialView<'_>) -> View {
    let known = configs.get(trial.id).is_some_and(|c| c == trial.config);
    if !known {
        configs.insert(trial.id.to_string(), trial.config.clone());
    }
    View { config: (!known).then(|| trial.config.clone()), ..owned(trial) }
}

fn owned(trial: &TrialView<'_>) -> View {
    View { id: trial.id.to_string(), config: None, status: trial.status, num_results: trial.num_results, num_workers: trial.num_workers }
}

enum ReplayError {
    Store(StoreError),
    Corrupt(String),
}

impl From<StoreError> for ReplayError {
    fn from(e: StoreError) -> Self {
        ReplayError::Store(e)
    }
}

/// The reading side: the configs and the paused list as the journal gave them.
struct Replay<'a> {
    store: &'a Store,
    configs: HashMap<String, Config>,
    /// The latest `Choose`'s paused list, with each trial's config.
    paused: Vec<(View, Config)>,
}

impl Replay<'_> {
    /// The config `view` carries, or the one given for its trial before.
    fn resolve(&mut self, view: View) -> Result<(View, Config), ReplayError> {
        let config = match &view.config {
            Some(c) => {
                self.configs.insert(view.id.clone(), c.clone());
                c.clone()
            }
            None => self
                .configs
                .get(&view.id)
                .cloned()
                .ok_or_else(|| ReplayError::Corrupt(format!("{} is named without its config", view.id)))?,
        };
        Ok((View { config: None, ..view }, config))
    }

    fn result(&self, trial: &str, seq: u64) -> Result<TrialResult, ReplayError> {
        self.store.result(trial, seq)?.ok_or_else(|| ReplayError::Corrupt(format!("{trial}'s result {seq} is not in the store")))
    }

    fn apply(&mut self, scheduler: &mut dyn Scheduler, told: &mut Told, call: Call) -> Result<(), ReplayError> {
        match call {
            Call::Add { trial } => {
                let (v, c) = self.resolve(trial)?;
                scheduler.on_trial_add(&borrowed(&v, &c));
                told.seen.entry(v.id).or_insert(0);
                told.added = told.added.map(|n| n + 1);
            }
            Call::Result { trial, seq } => {
                let (v, c) = self.resolve(trial)?;
                let result = self.result(&v.id, seq)?;
                let _ = scheduler.on_trial_result(&borrowed(&v, &c), &result);
                told.seen.insert(v.id, seq + 1);
            }
            Call::Complete { trial, seq } => {
                let (v, c) = self.resolve(trial)?;
                let result = seq.map(|s| self.result(&v.id, s)).transpose()?;
                scheduler.on_trial_complete(&borrowed(&v, &c), result.as_ref());
                self.configs.remove(&v.id);
                told.seen.remove(&v.id);
            }
            Call::Error { trial } => {
                let (v, c) = self.resolve(trial)?;
                scheduler.on_trial_error(&borrowed(&v, &c));
                self.configs.remove(&v.id);
                told.seen.remove(&v.id);
            }
            Call::Choose { paused, can_add, chose } => {
                let mut now = Vec::new();
                for piece in paused {
                    match piece {
                        Piece::Kept { from, len } => {
                            let kept = self.paused.get(from..from + len).ok_or_else(|| {
                                ReplayError::Corrupt(format!("a paused list refers to {from}..{} of {}", from + len, self.paused.len()))
                            })?;
                            now.extend(kept.iter().cloned());
                        }
                        Piece::New(v) => now.push(self.resolve(v)?),
                    }
                }
                let views: Vec<TrialView<'_>> = now.iter().map(|(v, c)| borrowed(v, c)).collect();
                let again = scheduler.choose_trial_to_run(&views, can_add);
                // A journal written before choices were ids gave the place in the list.
                let chose = chose.map(|c| match c {
                    Value::Number(n) => n
                        .as_u64()
                        .and_then(|i| <[TrialView<'_>]>::get(&views, i as usize))
                        .map_or(Value::Null, |t| Value::String(t.id.to_string())),
                    other => other,
                });
                if again.clone().map(Value::String) != chose {
                    tracing::warn!(?chose, ?again, "the scheduler chose differently when its calls were replayed");
                }
                drop(views);
                self.paused = now;
            }
            Call::NoMore => scheduler.on_no_more_trials(),
            Call::TakeStopped { trials } => {
                let again = scheduler.take_stopped();
                if again != trials {
                    tracing::warn!(?trials, ?again, "the scheduler gave up on other trials when its calls were replayed");
                }
            }
            Call::TakeExploits { trials } => {
                let again: Vec<String> = scheduler.take_exploits().into_iter().map(|e| e.trial_id).collect();
                if again != trials {
                    tracing::warn!(?trials, ?again, "the scheduler exploited other trials when its calls were replayed");
                }
            }
            Call::Capacity { capacity } => scheduler.on_capacity(capacity),
            Call::Forget { trial } => {
                self.configs.remove(&trial);
                told.seen.remove(&trial);
            }
        }
        Ok(())
    }
}

fn borrowed<'a>(v: &'a View, config: &'a Config) -> TrialView<'a> {
    TrialView { id: &v.id, config, status: v.status, num_results: v.num_results, num_workers: v.num_workers }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use serde_json::json;

    use schedulers::{AshaConfig, AshaType, Decision, HyperBandConfig, Scheduler, SchedulerConfig, TrialStatus, TrialView};
    use search::{Mode, TrialResult};

    use super::Journaled;
    use crate::store::Store;

    struct Trial {
        id: String,
        config: serde_json::Value,
        status: TrialStatus,
        results: u64,
    }

    fn view(t: &Trial) -> TrialView<'_> {
        TrialView { id: &t.id, config: &t.config, status: t.status, num_results: t.results, num_workers: 1 }
    }

    /// A scheduler whose state is a digest of every call it got, views and
    /// results whole: a replay that differs in any detail shows.
    #[derive(Default)]
    struct Recorder {
        digest: u64,
        stopped: Vec<String>,
    }

    impl Recorder {
        fn mix(&mut self, what: impl std::fmt::Debug) -> u64 {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (self.digest, format!("{what:?}")).hash(&mut h);
            self.digest = h.finish();
            self.digest
        }
    }

    impl Scheduler for Recorder {
        fn on_trial_result(&mut self, trial: &TrialView<'_>, result: &TrialResult) -> Decision {
            match self.mix(("result", trial, result)) % 5 {
                0 => Decision::Pause,
                1 => Decision::Stop,
                _ => Decision::Continue,
            }
        }
        fn on_trial_add(&mut self, trial: &TrialView<'_>) {
            self.mix(("add", trial));
        }
        fn on_trial_complete(&mut self, trial: &TrialView<'_>, result: Option<&TrialResult>) {
            self.mix(("complete", trial, result));
        }
        fn on_trial_error(&mut self, trial: &TrialView<'_>) {
            self.mix(("error", trial));
        }
        fn choose_trial_to_run(&mut self, paused: &dyn schedulers::Paused, can_add: bool) -> Option<String> {
            let views: Vec<TrialView<'_>> = paused.iter().collect();
            let d = self.mix(("choose", &views, can_add));
            (!d.is_multiple_of(3) && !views.is_empty()).then(|| views[d as usize % views.len()].id.to_string())
        }
        fn on_no_more_trials(&mut self) {
            let d = self.mix("no more");
            self.stopped.push(format!("t{:03}", d % 40));
        }
        fn take_stopped(&mut self) -> Vec<String> {
            std::mem::take(&mut self.stopped)
        }
        fn save(&self) -> serde_json::Value {
            json!({ "version": 1, "digest": self.digest, "stopped": self.stopped })
        }
        fn restore(&mut self, state: &serde_json::Value) -> Result<(), schedulers::SchedulerError> {
            self.digest = state["digest"].as_u64().unwrap_or_default();
            self.stopped = serde_json::from_value(state["stopped"].clone()).unwrap_or_default();
            Ok(())
        }
    }

    fn build(kind: usize) -> Box<dyn Scheduler> {
        let config = match kind {
            3 => return Box::new(Recorder::default()),
            4 => SchedulerConfig::MedianStopping(schedulers::MedianStoppingConfig { grace_period: 2.0, ..Default::default() }),
            5 => {
                let mutations: toml::Table = toml::from_str("x = { uniform = [0.0, 1.0] }").unwrap();
                SchedulerConfig::Pbt(schedulers::PbtConfig {
                    perturbation_interval: 2.0,
                    hyperparam_mutations: mutations,
                    seed: Some(7),
                    ..Default::default()
                })
            }
            0 => SchedulerConfig::Asha(AshaConfig {
                asha_type: AshaType::Promotion,
                max_t: 9.0,
                grace_period: Some(1.0),
                reduction_factor: 3.0,
                brackets: 2,
                ..Default::default()
            }),
            1 => SchedulerConfig::Hyperband(HyperBandConfig { max_t: 9.0, reduction_factor: 3.0, ..Default::default() }),
            _ => SchedulerConfig::Asha(AshaConfig { max_t: 9.0, reduction_factor: 3.0, ..Default::default() }),
        };
        config.build(Some("loss"), Some(Mode::Min)).unwrap()
    }

    /// Drives `journaled` and a `reference` that is never journaled with
    /// the same random calls, the loop's way (a pause moves a trial to the
    /// paused list, a choice takes it back); at each step in `cuts` the
    /// journaled one is dropped and resumed from the store. Both must
    /// decide alike throughout and end in the same state.
    fn drive(kind: usize, seed: u64, steps: usize, cuts: &[usize], min_bytes: usize) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let mut journaled = Journaled::new(build(kind), &store, true);
        journaled.log.as_mut().unwrap().min_bytes = min_bytes;
        let mut reference = build(kind);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut trials: Vec<Trial> = Vec::new();
        let mut paused: Vec<usize> = Vec::new();
        let mut seen: HashMap<String, u64> = HashMap::new();
        let mut snapshots = 0;
        for step in 0..steps {
            if cuts.contains(&step) {
                // What a flush wrote is what a driver killed now leaves.
                journaled.release();
                store.flush().unwrap();
                let mut resumed = Journaled::resume(build(kind), &store, true).unwrap();
                resumed.log.as_mut().unwrap().min_bytes = min_bytes;
                assert_eq!(resumed.scheduler().save(), reference.save(), "state after a resume at step {step}");
                assert_eq!(resumed.added(), Some(trials.len() as u64));
                for t in &trials {
                    assert_eq!(resumed.is_live(&t.id), !t.status.is_finished(), "{} live at step {step}", t.id);
                    assert_eq!(resumed.seen(&t.id), seen.get(&t.id).copied().unwrap_or(0), "{} seen at step {step}", t.id);
                }
                journaled = resumed;
            }
            let running: Vec<usize> = (0..trials.len()).filter(|&i| trials[i].status == TrialStatus::Running).collect();
            let pick = |rng: &mut ChaCha8Rng| running.get(rng.random_range(0..running.len().max(1))).copied();
            match rng.random_range(0..100) {
                0..=14 if trials.len() < 40 => {
                    let t = Trial {
                        id: format!("t{:03}", trials.len()),
                        config: json!({ "x": rng.random::<f64>() }),
                        status: TrialStatus::Pending,
                        results: 0,
                    };
                    journaled.on_trial_add(&view(&t)).unwrap();
                    reference.on_trial_add(&view(&t));
                    trials.push(Trial { status: TrialStatus::Running, ..t });
                }
                0..=59 => {
                    let Some(i) = pick(&mut rng) else { continue };
                    let t = &mut trials[i];
                    let seq = t.results;
                    let metrics = [("loss".to_string(), rng.random::<f64>()), ("training_iteration".to_string(), (seq + 1) as f64)];
                    let result = TrialResult {
                        extra: None,
                        trial_id: t.id.clone(),
                        seq,
                        training_iteration: seq + 1,
                        metrics: metrics.into_iter().collect(),
                        checkpoint: None,
                    };
                    store.put_result(&result).unwrap();
                    t.results += 1;
                    let decision = journaled.on_trial_result(&view(t), &result).unwrap();
                    assert_eq!(decision, reference.on_trial_result(&view(t), &result), "decision at step {step}");
                    seen.insert(t.id.clone(), seq + 1);
                    match decision {
                        Decision::Pause => {
                            t.status = TrialStatus::Paused;
                            let at = paused.partition_point(|&p| p < i);
                            paused.insert(at, i);
                        }
                        Decision::Stop => {
                            t.status = TrialStatus::Terminated;
                            journaled.on_trial_complete(&view(t), Some(&result)).unwrap();
                            reference.on_trial_complete(&view(t), Some(&result));
                            seen.remove(&t.id);
                        }
                        _ => {}
                    }
                }
                60..=71 => {
                    if paused.is_empty() {
                        continue;
                    }
                    let can_add = rng.random_bool(0.5);
                    let views: Vec<TrialView<'_>> = paused.iter().map(|&i| view(&trials[i])).collect();
                    let chose = journaled.choose_trial_to_run(&views, can_add).unwrap();
                    assert_eq!(chose, reference.choose_trial_to_run(&views, can_add), "choice at step {step}");
                    if let Some(id) = chose {
                        let k = paused.iter().position(|&i| trials[i].id == id).unwrap();
                        let i = paused.remove(k);
                        trials[i].status = TrialStatus::Running;
                    }
                }
                72..=75 => {
                    let Some(i) = pick(&mut rng) else { continue };
                    let t = &mut trials[i];
                    t.status = TrialStatus::Terminated;
                    journaled.on_trial_complete(&view(t), None).unwrap();
                    reference.on_trial_complete(&view(t), None);
                    seen.remove(&t.id);
                }
                76..=78 => {
                    let Some(i) = pick(&mut rng) else { continue };
                    let t = &mut trials[i];
                    t.status = TrialStatus::Error;
                    journaled.on_trial_error(&view(t)).unwrap();
                    reference.on_trial_error(&view(t));
                    seen.remove(&t.id);
                }
                79..=81 => {
                    // An exploit changes a running trial's config.
                    let Some(i) = pick(&mut rng) else { continue };
                    trials[i].config = json!({ "x": rng.random::<f64>() });
                }
                82..=83 => {
                    journaled.on_no_more_trials().unwrap();
                    reference.on_no_more_trials();
                    let stopped = journaled.take_stopped().unwrap();
                    assert_eq!(stopped, reference.take_stopped(), "given up on at step {step}");
                    for id in stopped {
                        let Some(i) = trials.iter().position(|t| t.id == id) else { continue };
                        if let Some(k) = paused.iter().position(|&p| p == i) {
                            paused.remove(k);
                            trials[i].status = TrialStatus::Terminated;
                            journaled.forget(&id);
                            seen.remove(&id);
                        }
                    }
                }
                _ => {
                    journaled.release();
                    store.flush().unwrap();
                    let before = journaled.log.as_ref().unwrap().snapshot_bytes;
                    journaled.maintain();
                    snapshots += usize::from(journaled.log.as_ref().unwrap().snapshot_bytes != before);
                }
            }
        }
        journaled.release();
        store.flush().unwrap();
        let resumed = Journaled::resume(build(kind), &store, true).unwrap();
        assert_eq!(resumed.scheduler().save(), reference.save(), "state after a resume at the end");
        let _ = snapshots;
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// A scheduler resumed from its snapshot and journal, at any point
        /// and any number of times, is where the one never stopped is.
        #[test]
        fn a_resumed_scheduler_is_where_its_calls_left_it(
            kind in 0usize..6,
            seed in any::<u64>(),
            cuts in proptest::collection::vec(0usize..600, 0..4),
            min_bytes in prop_oneof![Just(0usize), Just(2048), Just(1 << 20)],
        ) {
            drive(kind, seed, 600, &cuts, min_bytes);
        }
    }

    /// A call reaches the journal file only once the loop has released it
    /// (after storing what it led to) and a flush has run; a snapshot
    /// releases the calls it covers first.
    #[test]
    fn calls_wait_for_their_release() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let mut j = Journaled::new(build(0), &store, true);
        let config = json!({ "x": 0.5 });
        let t = TrialView { id: "t0", config: &config, status: TrialStatus::Running, num_results: 0, num_workers: 1 };
        let records = |store: &Store| store.latest_journal().unwrap().map_or(0, |(_, records)| records.len());
        store.flush().unwrap();
        let before = records(&store);
        j.on_trial_add(&t).unwrap();
        store.flush().unwrap();
        assert_eq!(records(&store), before, "held: not written by a flush before its release");
        j.release();
        store.flush().unwrap();
        assert_eq!(records(&store), before + 1);
        j.on_trial_error(&t).unwrap();
        j.write_snapshot();
        store.flush().unwrap();
        let resumed = Journaled::resume(build(0), &store, true).unwrap();
        assert!(!resumed.is_live("t0"), "the snapshot holds the call it released");
    }

    /// The journal is pruned once a snapshot is durable: a long sweep keeps
    /// a journal of bounded length.
    #[test]
    fn snapshots_bound_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let mut j = Journaled::new(build(0), &store, true);
        j.log.as_mut().unwrap().min_bytes = 4096;
        let config = json!({ "x": 0.5 });
        let (mut longest, mut segments) = (0, 0);
        for n in 0..2000u64 {
            let id = format!("t{n:05}");
            let t = TrialView { id: &id, config: &config, status: TrialStatus::Running, num_results: 0, num_workers: 1 };
            j.on_trial_add(&t).unwrap();
            let result = TrialResult {
                extra: None,
                trial_id: id.clone(),
                seq: 0,
                training_iteration: 9,
                metrics: [("loss".to_string(), n as f64), ("training_iteration".to_string(), 9.0)].into_iter().collect(),
                checkpoint: None,
            };
            store.put_result(&result).unwrap();
            assert_eq!(j.on_trial_result(&t, &result).unwrap(), Decision::Stop);
            j.on_trial_complete(&t, Some(&result)).unwrap();
            j.release();
            store.flush().unwrap();
            j.maintain();
            longest = longest.max(store.latest_journal().unwrap().map_or(0, |(_, records)| records.len()));
            segments = segments.max(std::fs::read_dir(dir.path().join("store/journal")).unwrap().count());
        }
        assert!(segments <= 2, "{segments} journal segments at once");
        // A snapshot grows with the trials; the journal stays within twice its size.
        let snapshot = j.log.as_ref().unwrap().snapshot_bytes;
        assert!(snapshot > 4096, "{snapshot}");
        assert!(longest > 0 && longest < 2000, "the journal held {longest} entries at once");
        j.release();
        store.flush().unwrap();
        let resumed = Journaled::resume(build(0), &store, true).unwrap();
        assert_eq!(resumed.scheduler().save(), j.scheduler().save());
        // Calls made after the last flush are not in the journal: a resume
        // does not see them (the store's trials tell what they did).
        let id = "late".to_string();
        let t = TrialView { id: &id, config: &config, status: TrialStatus::Pending, num_results: 0, num_workers: 1 };
        j.on_trial_add(&t).unwrap();
        let resumed = Journaled::resume(build(0), &store, true).unwrap();
        assert!(!resumed.is_live("late"));
        assert_eq!(resumed.added(), Some(2000));
    }
}
