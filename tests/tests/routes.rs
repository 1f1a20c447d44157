//! A case per route of the run's contract, on the process engine: a run
//! that checkpoints, then a run that resumes from what it saved, with its
//! state whole. The routes are those of a machine that shares the
//! experiment's directory (staged checkpoints, a rendezvous file, a local
//! restore), of nodes that share none (`NESTOR_NODE_VIEW=unshared`:
//! shipped, met and fetched through the driver), and of a trial whose
//! checkpoints are in a bucket (a real S3-compatible server on loopback):
//! uploaded by the ranks, and restored by the ranks from the bucket
//! without the driver; and of ranks that cannot reach that bucket: their
//! checkpoints go through the driver, and so does their restore, the
//! driver downloading the checkpoint when the first rank asks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use tokio::sync::mpsc;
use trainer::{Backend, Directive, EventKind, ExitOutcome, LaunchSpec, ProcessBackend, ProcessConfig, Storage, WorkerBundle};

/// Runs `spec` to its end, continuing every step; the iterations, the last
/// `acc` and the last checkpoint's URI.
async fn run(backend: &ProcessBackend, spec: LaunchSpec) -> (Vec<u64>, f64, Option<String>) {
    let (tx, mut events) = mpsc::unbounded_channel();
    let name = spec.trial_id.clone();
    let _handle = backend.launch(spec, tx).unwrap();
    let (mut steps, mut acc, mut checkpoint) = (Vec::new(), 0.0, None);
    loop {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(60), events.recv()).await.expect("an event within 60 s").unwrap();
        match ev.kind {
            EventKind::Report { report, reply } => {
                steps.push(report.training_iteration);
                acc = report.metrics["acc"];
                if let Some(c) = report.checkpoint {
                    assert_eq!((c.ranks.clone(), c.world_size), (vec![0, 1], 2), "{name}: every rank's shard");
                    checkpoint = Some(c.uri);
                }
                reply.send(Directive::Continue).durable();
            }
            EventKind::Exited(outcome) => {
                assert_eq!(outcome, ExitOutcome::Completed, "{name}");
                return (steps, acc, checkpoint);
            }
            _ => {}
        }
    }
}

fn spec(trial: &str, dir: &Path, steps: u64, storage: &Storage) -> LaunchSpec {
    let config = serde_json::json!({ "x": 0.5, "steps": steps, "sleep_ms": 20, "checkpoint": true, "dump_env": true });
    let mut spec = LaunchSpec::new(trial, config, dir.join(trial));
    spec.workers = vec![WorkerBundle::cpus(1.0); 2];
    spec.storage = storage.clone();
    spec
}

/// What the fixture worker's `acc` is after `steps` steps of `x = 0.5`.
fn acc(steps: u64) -> f64 {
    (1..=steps).fold(0.0, |a, s| a + (0.5f64 - 0.3).powi(2) + 1.0 / s as f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_of_the_contract_checkpoints_and_resumes_whole() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = common::S3Server::start(&dir.path().join("s3"));
    // The driver's credentials for the bucket; its ranks inherit them. (This binary has this one test.)
    for (k, v) in s3.env() {
        std::env::set_var(k, v);
    }
    for route in ["shared", "unshared", "bucket", "unreached"] {
        let mut config = ProcessConfig::new(vec![common::worker().to_string()]);
        config.env.insert("NESTOR_NODE_VIEW".into(), if route == "unshared" { "unshared" } else { "shared" }.into());
        if route == "unreached" {
            // The ranks' endpoint for the bucket refuses connections; the driver's is the server.
            config.env.insert("AWS_ENDPOINT".into(), "http://127.0.0.1:9".into());
        }
        let backend = ProcessBackend::start(config).await.unwrap();
        let trial = format!("{route}_trial");
        let trial_dir = dir.path().join(&trial);
        let storage = match route {
            "bucket" | "unreached" => Storage::parse(&format!("s3://bucket/runs/routes/trials/{trial}")).unwrap(),
            _ => Storage::local(&trial_dir),
        };
        let (steps, _, saved) = run(&backend, spec(&trial, dir.path(), 2, &storage)).await;
        assert_eq!(steps, [1, 2], "{route}");
        let saved = saved.unwrap_or_else(|| panic!("{route}: no checkpoint"));
        let mut resumed = spec(&trial, dir.path(), 4, &storage);
        resumed.start_iteration = 2;
        match route {
            "bucket" | "unreached" => {
                assert!(saved.starts_with(&format!("s3://bucket/runs/routes/trials/{trial}/checkpoint_000002")), "{saved}");
                resumed.checkpoint_uri = Some(saved.clone());
            }
            _ => resumed.checkpoint = Some(PathBuf::from(&saved)),
        }
        let (steps, got, _) = run(&backend, resumed).await;
        assert_eq!(steps, [3, 4], "{route}: the resumed run goes on from the checkpoint");
        assert!((got - acc(4)).abs() < 1e-9, "{route}: the state came back whole ({got} against {})", acc(4));
        // The route each rank took, as its plan says, and where it read its shard from.
        for r in 0..2u32 {
            let dump: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(trial_dir.join(format!("rank-{r}.json"))).unwrap()).unwrap();
            let routes = &dump["plan"]["routes"];
            let from = dump["NESTOR_CHECKPOINT"].as_str().unwrap_or_else(|| panic!("{route}: rank {r} resumed from nothing: {dump}"));
            let fetched = std::env::temp_dir().join(format!("nestor-{trial}-rank-{r}-")).display().to_string();
            match route {
                "shared" => {
                    assert_eq!((routes["meet"]["kind"].as_str(), routes["out"]["kind"].as_str()), (Some("file"), Some("stage")));
                    assert_eq!(routes["back"]["kind"], "local");
                    assert_eq!(from, format!("{saved}/rank-{r}"));
                }
                "unshared" => {
                    assert_eq!((routes["meet"]["kind"].as_str(), routes["out"]["kind"].as_str()), (Some("driver"), Some("ship")));
                    assert_eq!(routes["back"]["kind"], "driver");
                    assert!(from.starts_with(&fetched), "{route}: {from}");
                }
                _ => {
                    // The same plan either way: what a rank reaches decides, at the rank.
                    assert_eq!(routes["out"]["kind"], "upload");
                    assert_eq!(routes["back"]["kind"], "store");
                    assert_eq!(routes["back"]["uri"], saved.as_str());
                    assert!(from.starts_with(&fetched), "{route}: {from}");
                }
            }
        }
        if route == "bucket" {
            // Uploaded by the ranks: every shard in the bucket, nothing of it on the driver's disk.
            let objects = s3.objects("runs/routes/trials/bucket_trial/checkpoint_000004");
            assert!(objects.iter().any(|o| o.ends_with("rank-0/state.json")) && objects.iter().any(|o| o.ends_with("rank-1/state.json")));
            assert!(!trial_dir.join("checkpoint_000004").exists());
            assert!(!trial_dir.join("restore").exists(), "the driver downloaded nothing to restore");
        }
        if route == "unreached" {
            // Through the driver both ways: it uploaded what the ranks staged, and downloaded the
            // checkpoint to restore once, when a rank asked.
            let objects = s3.objects("runs/routes/trials/unreached_trial/checkpoint_000004");
            assert!(objects.iter().any(|o| o.ends_with("rank-0/state.json")) && objects.iter().any(|o| o.ends_with("rank-1/state.json")));
            let restored = trial_dir.join("restore/checkpoint_000002");
            assert!(restored.join("rank-0").is_dir() && restored.join("rank-1").is_dir(), "{}", restored.display());
            let log = std::fs::read_to_string(trial_dir.join("logs/rank-1.log")).unwrap_or_default();
            assert!(log.contains("cannot download its checkpoint shard from s3://bucket/"), "{log}");
        }
    }
}
