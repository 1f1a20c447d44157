//! The run's contract: everything a run tells its ranks, as one value.
//!
//! [`RunPlan::new`] builds it once, by a pure function, from the launch
//! ([`PlanSettings`]) and what the placement knows of the nodes
//! ([`NodeView`]); its routes are enums ([`Rendezvous`], [`CheckpointOut`],
//! [`ResumeFrom`]). Each engine only renders it: the process engine and
//! the Slurm step as environment (`NESTOR_RUN`, JSON, beside the token in
//! `NESTOR_TOKEN` and torchrun's own variables), the Slurm job as its
//! script's environment. Ranks read it with [`RunPlan::from_env`] (Rust)
//! and `nestor/_contract.py` (Python), pinned to the same routes by the
//! fixtures in `tests/contract/`. A rank's place (`RANK`, `LOCAL_RANK`,
//! ...) stays torchrun's variables: frameworks read them, and a Slurm task
//! learns its own from Slurm's.
//!
//! The plan holds no secret: the token travels apart from it, so a plan
//! may be logged or written down. Ranks started before the plan existed
//! (a job script of an older experiment) speak the older protocol, one
//! variable a setting: [`RunPlan::from_env`] reads that too, as version 1.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The variable that carries the plan (JSON).
pub const PLAN_VAR: &str = "NESTOR_RUN";
/// The variable that carries the run's token (a bearer secret; never in the plan).
pub const TOKEN_VAR: &str = "NESTOR_TOKEN";
/// The plan's version: a rank refuses a plan newer than it knows.
pub const PLAN_VERSION: u32 = 2;

/// What a run tells its ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunPlan {
    /// [`PLAN_VERSION`] when written; 1 for a plan read from the older variables.
    pub version: u32,
    /// The trial this run trains.
    pub trial: TrialPlan,
    /// The run's world and its collective.
    pub world: WorldPlan,
    /// Where the driver listens.
    pub channel: ChannelPlan,
    /// How ranks meet, where checkpoints go and where a resumed run reads its own.
    pub routes: Routes,
    /// Where the placement does not know whether a node sees the
    /// experiment's directory: the routes of a node that does not, chosen
    /// by one test ([`Unshared::probe`] missing on the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unshared: Option<Unshared>,
    /// The experiment's data sets' plan (`datasets.json`), if it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datasets: Option<PathBuf>,
    /// The cluster's notice before it ends the run (a Slurm job's `--signal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<Preemption>,
}

/// The trial a run trains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialPlan {
    /// The trial's id.
    pub id: String,
    /// `<experiment>/trials/<id>`.
    pub dir: PathBuf,
    /// The config to train with (a JSON object).
    pub config: Value,
    /// Iterations already done: the first report is this plus one.
    pub start_iteration: u64,
    /// How often to checkpoint, in iterations (0: the trainable decides).
    pub checkpoint_frequency: u64,
    /// The experiment's name (Ray's `TrainContext.get_experiment_name`).
    pub experiment_name: String,
    /// Where the experiment is stored (a directory or a bucket's URI).
    pub storage_path: String,
}

/// The run's world and its collective.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorldPlan {
    /// How many ranks the run has.
    pub size: u32,
    /// Whether the ranks have GPUs.
    pub use_gpu: bool,
    /// PyTorch's collective backend (`gloo`, `nccl`).
    pub torch_backend: String,
    /// Seconds a collective may wait before it fails.
    pub collective_timeout_s: f64,
}

/// Where the driver listens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelPlan {
    /// The URL ranks dial (`http://` on loopback, `https://` over TLS).
    pub addr: String,
    /// Over TLS, the PEM of the authority the driver's certificate is signed by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<String>,
}

/// The routes of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Routes {
    /// How the ranks meet.
    pub meet: Rendezvous,
    /// Where a reported checkpoint goes.
    pub out: CheckpointOut,
    /// Where a resumed run reads its checkpoint from.
    pub back: ResumeFrom,
}

/// The routes of a node that does not see the experiment's directory,
/// where the placement cannot tell beforehand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unshared {
    /// A file the driver made in the experiment's directory: a node that
    /// sees it takes [`RunPlan::routes`], one that does not takes these.
    pub probe: PathBuf,
    /// The routes without the experiment's directory.
    pub routes: Routes,
}

/// How a run's ranks meet (PyTorch's process group).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rendezvous {
    /// A file every rank sees (fresh per launch): it meets at once.
    File {
        /// The file.
        path: PathBuf,
    },
    /// Rank 0's TCP store on a free port of its node, its address passed to
    /// the others through the driver (nodes that share no file).
    Driver,
    /// torchrun's `MASTER_ADDR` and `MASTER_PORT`, as set.
    Master,
}

/// Where a rank's reported checkpoint goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CheckpointOut {
    /// The driver copies it from where the rank saved it (a directory the driver sees).
    InPlace,
    /// The rank copies it below `dir` first; the driver moves the copy into place.
    Stage {
        /// The trial's staging directory.
        dir: PathBuf,
    },
    /// Sent to the driver through the channel, in chunks.
    Ship,
    /// Uploaded by the rank itself to the trial's object store; where an
    /// upload fails, `otherwise` from then on.
    Upload {
        /// The trial's checkpoints' location (`s3://...`).
        store: String,
        /// The `nestor` binary Python ranks upload with (`put-shard`), if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uploader: Option<String>,
        /// The route after a failed upload.
        otherwise: Box<CheckpointOut>,
    },
}

/// Where a resumed run's ranks read their checkpoint from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResumeFrom {
    /// A fresh start.
    None,
    /// The checkpoint's directory, which this node sees (`rank-<r>/` its shards).
    Local {
        /// The checkpoint (`.../checkpoint_NNNNNN`).
        checkpoint: PathBuf,
    },
    /// The rank's shard, fetched from the driver through the channel.
    Driver,
    /// The rank's shard, downloaded from the object store by the rank itself.
    Store {
        /// The checkpoint's URI (`s3://.../checkpoint_NNNNNN`).
        uri: String,
        /// The `nestor` binary Python ranks download with (`get-shard`), if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uploader: Option<String>,
    },
}

impl ResumeFrom {
    /// Whether the run resumes from a checkpoint.
    pub fn resumes(&self) -> bool {
        !matches!(self, ResumeFrom::None)
    }
}

/// The cluster's notice before it ends the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preemption {
    /// The signal the ranks get (`USR1`): recorded, not the end of them.
    pub signal: String,
    /// Seconds between the notice and the end.
    pub notice_s: u64,
}

/// What the placement knows of the nodes a run's ranks run on.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeView {
    /// They see the experiment's directory as the driver does (this
    /// machine, or a cluster's shared file system).
    Shared,
    /// They do not: checkpoints go through the driver or the bucket, and
    /// the ranks meet through the driver.
    Unshared,
    /// Unknown until a rank runs (a job Slurm places): both routes, the
    /// rank choosing by whether `probe` is on its node.
    Unknown {
        /// A file the driver made in the experiment's directory.
        probe: PathBuf,
    },
}

/// The launch's settings a plan is built from: plain values, no engine's config.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSettings {
    /// The trial.
    pub trial: TrialPlan,
    /// The world.
    pub world: WorldPlan,
    /// The channel.
    pub channel: ChannelPlan,
    /// The checkpoint the run resumes from, on the driver's disk.
    pub checkpoint: Option<PathBuf>,
    /// The trial's checkpoints' object store, where ranks upload their
    /// shards themselves (None: local storage, or uploads off).
    pub store: Option<String>,
    /// The checkpoint's URI in that store, where ranks that reach it read it directly.
    pub checkpoint_uri: Option<String>,
    /// The `nestor` binary, for Python ranks' uploads.
    pub uploader: Option<String>,
    /// The fresh rendezvous file of this launch, where the nodes share files.
    pub rendezvous_file: Option<PathBuf>,
    /// The experiment's data sets' plan.
    pub datasets: Option<PathBuf>,
    /// The cluster's notice before it ends the run.
    pub preemption: Option<Preemption>,
}

impl RunPlan {
    /// The plan of a launch on nodes seen as `view`.
    pub fn new(settings: PlanSettings, view: &NodeView) -> Self {
        let shared = Routes {
            meet: match &settings.rendezvous_file {
                Some(path) => Rendezvous::File { path: path.clone() },
                None => Rendezvous::Master,
            },
            out: upload_first(&settings, CheckpointOut::Stage { dir: settings.trial.dir.join(".incoming") }),
            back: match (&settings.checkpoint_uri, &settings.checkpoint) {
                (Some(uri), _) if settings.store.is_some() => ResumeFrom::Store { uri: uri.clone(), uploader: settings.uploader.clone() },
                (_, Some(c)) => ResumeFrom::Local { checkpoint: c.clone() },
                _ => ResumeFrom::None,
            },
        };
        let unshared = Routes {
            meet: Rendezvous::Driver,
            out: upload_first(&settings, CheckpointOut::Ship),
            back: match (&settings.checkpoint_uri, &settings.checkpoint) {
                (Some(uri), _) if settings.store.is_some() => ResumeFrom::Store { uri: uri.clone(), uploader: settings.uploader.clone() },
                (_, Some(_)) => ResumeFrom::Driver,
                _ => ResumeFrom::None,
            },
        };
        let (routes, unshared) = match view {
            NodeView::Shared => (shared, None),
            NodeView::Unshared => (unshared, None),
            NodeView::Unknown { probe } => (shared, Some(Unshared { probe: probe.clone(), routes: unshared })),
        };
        Self {
            version: PLAN_VERSION,
            trial: settings.trial,
            world: settings.world,
            channel: settings.channel,
            routes,
            unshared,
            datasets: settings.datasets,
            preemption: settings.preemption,
        }
    }

    /// The plan as the JSON ranks read from [`PLAN_VAR`].
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A plan from its JSON; a plan newer than this build knows is refused by name.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let plan: Self = serde_json::from_str(text).map_err(|e| format!("{PLAN_VAR} is not a run plan nestor can read: {e}"))?;
        if plan.version > PLAN_VERSION {
            return Err(format!(
                "{PLAN_VAR} is a version {} plan; this nestor reads up to version {PLAN_VERSION} (use the same nestor on the nodes as the driver)",
                plan.version
            ));
        }
        Ok(plan)
    }

    /// The routes this node takes: [`RunPlan::unshared`]'s where its probe
    /// is not on this node (`exists` answers for a path).
    pub fn routes_here(&self, exists: impl Fn(&Path) -> bool) -> &Routes {
        match &self.unshared {
            Some(u) if !exists(&u.probe) => &u.routes,
            _ => &self.routes,
        }
    }

    /// The environment engines give every rank alike: the plan and the token.
    pub fn env(&self, token: &str) -> [(String, String); 2] {
        [(PLAN_VAR.to_string(), self.to_json()), (TOKEN_VAR.to_string(), token.to_string())]
    }

    /// The plan this process was started with, and the token: `NESTOR_RUN`
    /// where set, else the older variables (version 1), else an error
    /// saying the program runs outside nestor.
    pub fn from_env() -> Result<(Self, String), String> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`RunPlan::from_env`] over any source of variables.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<(Self, String), String> {
        let token = var(TOKEN_VAR).unwrap_or_default();
        if let Some(text) = var(PLAN_VAR).filter(|t| !t.is_empty()) {
            return Ok((Self::from_json(&text)?, token));
        }
        legacy(&var).map(|plan| (plan, token))
    }
}

/// `then`, after an upload to the store where ranks upload themselves.
fn upload_first(settings: &PlanSettings, then: CheckpointOut) -> CheckpointOut {
    match &settings.store {
        Some(store) => CheckpointOut::Upload { store: store.clone(), uploader: settings.uploader.clone(), otherwise: Box::new(then) },
        None => then,
    }
}

/// A plan read from the variables of the protocol before the plan (a job
/// script of an older experiment still sets them).
fn legacy(var: &impl Fn(&str) -> Option<String>) -> Result<RunPlan, String> {
    let set = |k: &str| var(k).filter(|v| !v.is_empty());
    let need = |k: &str| set(k).ok_or_else(|| format!("{PLAN_VAR} is not set; run this program through nestor"));
    let number = |k: &str| -> Result<u64, String> {
        match set(k) {
            Some(v) => v.parse().map_err(|_| format!("{k}={v:?} is not a number")),
            None => Ok(0),
        }
    };
    let flag = |k: &str| set(k).is_some_and(|v| v == "1");
    let addr = need("NESTOR_ADDR")?;
    let id = need("NESTOR_TRIAL_ID")?;
    let config = match set("NESTOR_CONFIG") {
        Some(text) => serde_json::from_str(&text).map_err(|e| format!("NESTOR_CONFIG is not JSON: {e}"))?,
        None => Value::Object(Default::default()),
    };
    let dir = PathBuf::from(set("NESTOR_TRIAL_DIR").unwrap_or_default());
    let ship = flag("NESTOR_SHIP_CHECKPOINTS");
    let store = set("NESTOR_CHECKPOINT_STORE");
    let uploader = set("NESTOR_UPLOADER");
    let then = match set("NESTOR_CHECKPOINT_STAGING") {
        _ if ship => CheckpointOut::Ship,
        Some(dir) => CheckpointOut::Stage { dir: PathBuf::from(dir) },
        None => CheckpointOut::InPlace,
    };
    let out = match store {
        Some(store) => CheckpointOut::Upload { store, uploader, otherwise: Box::new(then) },
        None => then,
    };
    let back = if flag("NESTOR_CHECKPOINT_FETCH") {
        ResumeFrom::Driver
    } else {
        // The older protocol named this rank's shard; its checkpoint is the shard's parent.
        match set("NESTOR_CHECKPOINT").map(PathBuf::from) {
            Some(shard) => ResumeFrom::Local { checkpoint: shard.parent().map(Path::to_path_buf).unwrap_or(shard) },
            None => ResumeFrom::None,
        }
    };
    let meet = match (set("NESTOR_RENDEZVOUS"), set("NESTOR_RENDEZVOUS_FILE")) {
        (Some(r), _) if r == "driver" => Rendezvous::Driver,
        (_, Some(path)) => Rendezvous::File { path: PathBuf::from(path) },
        _ => Rendezvous::Master,
    };
    let timeout = match set("NESTOR_COLLECTIVE_TIMEOUT_S") {
        Some(v) => v.parse().map_err(|_| format!("NESTOR_COLLECTIVE_TIMEOUT_S={v:?} is not a number"))?,
        None => 1800.0,
    };
    let size = match set("WORLD_SIZE") {
        Some(v) => v.parse().map_err(|_| format!("WORLD_SIZE={v:?} is not a number"))?,
        None => 1,
    };
    let use_gpu = flag("NESTOR_USE_GPU");
    Ok(RunPlan {
        version: 1,
        trial: TrialPlan {
            id,
            dir,
            config,
            start_iteration: number("NESTOR_START_ITERATION")?,
            checkpoint_frequency: number("NESTOR_CHECKPOINT_FREQUENCY")?,
            experiment_name: set("NESTOR_EXPERIMENT_NAME").unwrap_or_default(),
            storage_path: set("NESTOR_STORAGE_PATH").unwrap_or_default(),
        },
        world: WorldPlan {
            size,
            use_gpu,
            torch_backend: set("NESTOR_TORCH_BACKEND").unwrap_or_else(|| if use_gpu { "nccl" } else { "gloo" }.to_string()),
            collective_timeout_s: timeout,
        },
        channel: ChannelPlan { addr, tls_ca: set(crate::tls::CA_VAR) },
        routes: Routes { meet, out, back },
        unshared: None,
        datasets: set("NESTOR_DATASETS").map(PathBuf::from),
        preemption: set("NESTOR_PREEMPTION_SIGNAL")
            .map(|signal| Preemption { signal, notice_s: set("NESTOR_PREEMPTION_NOTICE_S").and_then(|v| v.parse().ok()).unwrap_or(0) }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PlanSettings {
        PlanSettings {
            trial: TrialPlan {
                id: "t1".into(),
                dir: "/exp/e/trials/t1".into(),
                config: serde_json::json!({"lr": 0.1}),
                start_iteration: 4,
                checkpoint_frequency: 2,
                experiment_name: "e".into(),
                storage_path: "/exp".into(),
            },
            world: WorldPlan { size: 2, use_gpu: false, torch_backend: "gloo".into(), collective_timeout_s: 1800.0 },
            channel: ChannelPlan { addr: "https://login1:4000".into(), tls_ca: Some("PEM".into()) },
            checkpoint: Some("/exp/e/trials/t1/checkpoint_000004".into()),
            store: None,
            checkpoint_uri: None,
            uploader: None,
            rendezvous_file: Some("/exp/e/trials/t1/logs/.rendezvous-k".into()),
            datasets: None,
            preemption: None,
        }
    }

    #[test]
    fn each_view_gets_its_routes() {
        let shared = RunPlan::new(settings(), &NodeView::Shared);
        assert_eq!(shared.routes.meet, Rendezvous::File { path: "/exp/e/trials/t1/logs/.rendezvous-k".into() });
        assert_eq!(shared.routes.out, CheckpointOut::Stage { dir: "/exp/e/trials/t1/.incoming".into() });
        assert_eq!(shared.routes.back, ResumeFrom::Local { checkpoint: "/exp/e/trials/t1/checkpoint_000004".into() });
        assert!(shared.unshared.is_none());
        let unshared = RunPlan::new(settings(), &NodeView::Unshared);
        assert_eq!(unshared.routes, Routes { meet: Rendezvous::Driver, out: CheckpointOut::Ship, back: ResumeFrom::Driver });
        let probe = PathBuf::from("/exp/e/trials/t1/logs/job-k.out");
        let unknown = RunPlan::new(settings(), &NodeView::Unknown { probe: probe.clone() });
        assert_eq!(unknown.routes, shared.routes);
        assert_eq!(unknown.routes_here(|p| p == probe), &shared.routes);
        assert_eq!(unknown.routes_here(|_| false), &unshared.routes);
    }

    #[test]
    fn a_bucket_comes_first_and_a_resume_reads_it_directly() {
        let mut s = settings();
        s.store = Some("s3://b/e/trials/t1".into());
        s.checkpoint_uri = Some("s3://b/e/trials/t1/checkpoint_000004".into());
        s.uploader = Some("/usr/bin/nestor".into());
        let plan = RunPlan::new(s, &NodeView::Unshared);
        match &plan.routes.out {
            CheckpointOut::Upload { store, otherwise, .. } => {
                assert_eq!(store, "s3://b/e/trials/t1");
                assert_eq!(**otherwise, CheckpointOut::Ship);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(&plan.routes.back, ResumeFrom::Store { uri, .. } if uri.ends_with("checkpoint_000004")));
    }

    #[test]
    fn the_json_round_trips_and_carries_no_token() {
        let plan = RunPlan::new(settings(), &NodeView::Unknown { probe: "/p".into() });
        let env = plan.env("secret-token");
        assert!(!env[0].1.contains("secret-token"));
        let (back, token) = RunPlan::from_vars(|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())).unwrap();
        assert_eq!(back, plan);
        assert_eq!(token, "secret-token");
    }

    #[test]
    fn a_newer_plan_is_refused_by_name() {
        let mut plan = RunPlan::new(settings(), &NodeView::Shared);
        plan.version = PLAN_VERSION + 1;
        let err = RunPlan::from_json(&plan.to_json()).unwrap_err();
        assert!(err.contains("version 3") && err.contains(PLAN_VAR), "{err}");
    }

    #[test]
    fn the_older_variables_read_as_a_version_1_plan() {
        let vars = [
            ("NESTOR_ADDR", "http://127.0.0.1:5"),
            ("NESTOR_TRIAL_ID", "t9"),
            ("NESTOR_CONFIG", "{\"a\": 1}"),
            ("NESTOR_TRIAL_DIR", "/x/t9"),
            ("NESTOR_CHECKPOINT", "/x/t9/checkpoint_000002/rank-1"),
            ("NESTOR_START_ITERATION", "2"),
            ("NESTOR_SHIP_CHECKPOINTS", "1"),
            ("NESTOR_RENDEZVOUS", "driver"),
            ("WORLD_SIZE", "3"),
            ("NESTOR_TOKEN", "tok"),
        ];
        let (plan, token) = RunPlan::from_vars(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())).unwrap();
        assert_eq!((plan.version, token.as_str(), plan.trial.id.as_str(), plan.world.size), (1, "tok", "t9", 3));
        assert_eq!(plan.routes.out, CheckpointOut::Ship);
        assert_eq!(plan.routes.meet, Rendezvous::Driver);
        assert_eq!(plan.routes.back, ResumeFrom::Local { checkpoint: "/x/t9/checkpoint_000002".into() });
        assert_eq!(plan.trial.start_iteration, 2);
        let none = RunPlan::from_vars(|_| None).unwrap_err();
        assert!(none.contains("run this program through nestor"), "{none}");
    }
}
