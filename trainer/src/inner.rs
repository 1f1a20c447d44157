//! A trainer that a trial's function starts (Ray Train V2's Tune pattern: a
//! function trainable builds a `TorchTrainer` and calls `fit()`), run as
//! that trial's own run: the trial books the trainer's bundles (`Book`),
//! then asks the driver to run it (`RunTrainer`). The sweep's engine
//! launches its ranks on those bundles, its events go to the sweep's one
//! loop, and each of its results, restarts and its end go back to the
//! trial's process on the call's stream.
//!
//! What the trial asks for is a [`TrainerRun`] (JSON); the report server
//! checks it and prepares it off the loop ([`prepare`]: the program found,
//! the storage opened, the run's latest committed checkpoint looked up,
//! with a deadline), and the loop gets it as [`EventKind::RunTrainer`](crate::EventKind::RunTrainer).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{FailureConfig, ProcessConfig, Storage, TrainerConfig, COMMITTED_MARKER};

/// How long looking up a run's latest committed checkpoint may take (an
/// object store that does not answer).
const LOOKUP_DEADLINE: Duration = Duration::from_secs(30);

/// A trainer's run as its trial asks for it (`TrainerRequest.run`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerRun {
    /// The run's name (`RunConfig.name`): one path component.
    pub name: String,
    /// Where its logs and `result.jsonl` go, and its checkpoints unless
    /// `storage` says otherwise (an absolute directory).
    pub dir: PathBuf,
    /// Where its checkpoints go when not `dir`: an object store's URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    /// Its ranks' command, environment, working directory and collectives
    /// (the `[trainer]` section; its scaling keys are what the trial booked).
    pub trainer: TrainerConfig,
    /// The config its ranks read (`get_config`).
    #[serde(default)]
    pub config: Value,
    /// Restarts from its latest checkpoint after its ranks fail.
    #[serde(default)]
    pub failure: FailureConfig,
    /// Which of its checkpoints to keep (the `[checkpoint]` keys
    /// `num_to_keep`, `score_attribute`, `score_order`), read by the loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<Value>,
}

/// A [`TrainerRun`] checked and made ready to launch.
#[derive(Debug, Clone)]
pub struct PreparedRun {
    /// What was asked for.
    pub run: TrainerRun,
    /// What each rank runs.
    pub program: ProcessConfig,
    /// Where its checkpoints go.
    pub storage: Storage,
    /// Its latest committed checkpoint (a run of this name that ran
    /// before: a restarted trial's trainer goes on from there), with its
    /// iteration.
    pub latest: Option<(String, u64)>,
}

/// What the trial's process is told of its trainer's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainerUpdate {
    /// A result of the run (rank 0's metrics), with its checkpoint.
    Result {
        /// 1-based, across restarts.
        training_iteration: u64,
        /// Rank 0's metrics.
        metrics: BTreeMap<String, f64>,
        /// Rank 0's values that are not numbers.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        extra: Option<Value>,
        /// The step's checkpoint (every shard persisted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint: Option<String>,
        /// Every rank's metrics, by rank (empty with one rank).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rank_metrics: Vec<BTreeMap<String, f64>>,
    },
    /// The ranks failed; the run starts again from `from` (its latest checkpoint).
    Restarted {
        /// Why they failed.
        failure: String,
        /// Failures so far.
        failures: u32,
        /// The checkpoint it restarts from, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
    },
    /// The run is over and none of its processes is left.
    Ended {
        /// `completed`, `stopped` or `failed`.
        status: String,
        /// Why it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// Failures it restarted after.
        failures: u32,
    },
}

/// Checks `run` and makes it ready: the program found, the storage
/// opened, its latest committed checkpoint looked up. The error names the
/// key at fault.
pub async fn prepare(run: TrainerRun) -> Result<PreparedRun, String> {
    let name = run.name.as_str();
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.chars().any(char::is_control) {
        return Err(format!("name {name:?} must be one path component"));
    }
    if !run.dir.is_absolute() {
        return Err(format!("dir {} must be an absolute path", run.dir.display()));
    }
    run.trainer.check().map_err(|e| format!("trainer.{e}"))?;
    let mut program = run.trainer.process_config().map_err(|e| format!("trainer.{e}"))?;
    program.use_gpu = run.trainer.use_gpu;
    // One process per rank: a warm process is started from one command for the whole sweep.
    program.warm = crate::Warm::Cold;
    let storage = match &run.storage {
        None => Storage::local(&run.dir),
        Some(s) => Storage::parse(s).map_err(|e| format!("storage: {e}"))?,
    };
    let latest = match tokio::time::timeout(LOOKUP_DEADLINE, latest_committed(&storage)).await {
        Ok(found) => found.map_err(|e| format!("storage: {e}"))?,
        Err(_) => return Err(format!("storage: {} did not answer within {} s", storage.uri(""), LOOKUP_DEADLINE.as_secs())),
    };
    Ok(PreparedRun { run, program, storage, latest })
}

/// The newest `checkpoint_NNNNNN` below `storage` that holds its commit
/// marker, with its iteration.
async fn latest_committed(storage: &Storage) -> Result<Option<(String, u64)>, crate::StorageError> {
    for uri in storage.list_checkpoints().await?.into_iter().rev() {
        let Some(iteration) = checkpoint_iteration(&uri) else { continue };
        let committed = if storage.is_local() {
            Path::new(&uri).join(COMMITTED_MARKER).is_file()
        } else {
            let rel = format!("{}/{COMMITTED_MARKER}", crate::checkpoint_dir_name(iteration));
            storage.get_bytes(&rel).await?.is_some()
        };
        if committed {
            return Ok(Some((uri, iteration)));
        }
    }
    Ok(None)
}

/// 7 for `.../checkpoint_000007` (a path or a URL).
pub(crate) fn checkpoint_iteration(uri: &str) -> Option<u64> {
    uri.trim_end_matches('/').rsplit('/').next()?.strip_prefix("checkpoint_")?.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn run(dir: &Path) -> TrainerRun {
        serde_json::from_value(serde_json::json!({
            "name": "train",
            "dir": dir,
            "trainer": { "command": ["sh", "-c", "true"] },
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_run_is_checked_by_key_and_finds_its_latest_committed_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let p = prepare(run(dir.path())).await.unwrap();
        assert_eq!(p.latest, None);
        assert_eq!(p.program.warm, crate::Warm::Cold);
        for (i, committed) in [(1, true), (2, true), (3, false)] {
            let c = dir.path().join(crate::checkpoint_dir_name(i));
            std::fs::create_dir_all(c.join("rank-0")).unwrap();
            if committed {
                std::fs::write(c.join(COMMITTED_MARKER), "{}").unwrap();
            }
        }
        let p = prepare(run(dir.path())).await.unwrap();
        let (uri, iteration) = p.latest.unwrap();
        assert_eq!(iteration, 2);
        assert!(uri.ends_with("checkpoint_000002"), "{uri}");

        let bad = |edit: &dyn Fn(&mut TrainerRun)| {
            let mut r = run(dir.path());
            edit(&mut r);
            futures_util::FutureExt::now_or_never(prepare(r)).unwrap().unwrap_err()
        };
        assert!(bad(&|r| r.name = "a/b".into()).starts_with("name"));
        assert!(bad(&|r| r.name = "a\nb".into()).starts_with("name"));
        assert!(bad(&|r| r.dir = "rel".into()).starts_with("dir"));
        assert!(bad(&|r| r.trainer.command = vec!["no-such-program-here".into()]).starts_with("trainer.command"));
        assert!(bad(&|r| r.trainer.collective_timeout_s = 0.0).starts_with("trainer.collective_timeout_s"));
        let unknown =
            serde_json::from_value::<TrainerRun>(serde_json::json!({"name": "x", "dir": "/x", "trainer": {"command": ["a"]}, "colour": 1}));
        assert!(unknown.unwrap_err().to_string().contains("colour"));
    }

    #[test]
    fn updates_are_one_key_objects() {
        let u = TrainerUpdate::Ended { status: "completed".into(), error: None, failures: 0 };
        assert_eq!(serde_json::to_value(&u).unwrap(), serde_json::json!({"ended": {"status": "completed", "failures": 0}}));
        assert_eq!(checkpoint_iteration("s3://b/x/checkpoint_000012/"), Some(12));
    }
}
