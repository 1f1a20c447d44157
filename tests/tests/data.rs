//! `nestor.data` for real: Parquet, CSV and JSON files written by the
//! tests, a `TorchTrainer(datasets=...)` whose ranks read their shares with
//! `get_dataset_shard`, in the cached torch environment (with pyarrow).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::data::*;
use common::python::*;
use common::*;
use serde_json::Value;

fn data_py(dir: &Path, args: &[&str]) -> String {
    let mut all = vec![dir.to_str().unwrap()];
    all.extend_from_slice(args);
    passed(torch_python(dir, "tests/py/data.py", &all, &[]))
}

/// 103 rows over `workers` ranks, 3 epochs: equal counts, no row twice in
/// an epoch, the rows left out never the same two epochs in a row.
fn split(workers: u32, format: &str, shuffle: bool) -> Vec<Vec<Vec<u64>>> {
    let dir = tempfile::tempdir().unwrap();
    let order = if shuffle { "shuffle" } else { "noshuffle" };
    data_py(dir.path(), &["split", &workers.to_string(), format, order, "3"]);
    check_split(&dir.path().join(format!("runs/split-{workers}-{format}-{order}-0")), workers, format)
}

#[test]
fn every_rank_reads_as_many_rows_and_no_row_twice_an_epoch_from_parquet_csv_and_json() {
    for (workers, format) in [(1, "parquet"), (2, "parquet"), (3, "parquet"), (2, "csv"), (3, "json")] {
        let by_epoch = split(workers, format, false);
        // Unshuffled, a rank reads its rows in the files' order.
        for ranks in &by_epoch {
            for ids in ranks {
                assert!(ids.windows(2).all(|w| w[0] < w[1]), "{format}: {ids:?}");
            }
        }
    }
}

#[test]
fn a_shuffled_data_set_has_a_new_order_every_epoch_and_the_same_orders_for_a_seed() {
    let first = split(3, "parquet", true);
    let again = split(3, "parquet", true);
    assert_eq!(first, again, "the same seed gives the same orders");
    assert_ne!(first[0], first[1], "epoch 1's order is epoch 0's");
    assert_ne!(first[1], first[2]);
    let natural: Vec<u64> = first[0][0].iter().copied().collect::<BTreeSet<_>>().into_iter().collect();
    assert_ne!(first[0][0], natural, "rank 0's rows come in the files' order: not shuffled");
}

#[test]
fn a_data_set_not_split_is_read_whole_by_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    data_py(dir.path(), &["whole"]);
    let lines = rank_lines(&dir.path().join("runs/whole"), 2);
    for rank in &lines {
        let ids: BTreeSet<u64> = rank[0]["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(ids, (0..103).collect(), "every rank reads every row");
        assert_eq!(rank[0]["count"].as_u64(), Some(103));
    }
}

#[test]
fn map_batches_runs_in_the_ranks_and_torch_batches_come_in_the_asked_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    data_py(dir.path(), &["mapped"]);
    let lines = rank_lines(&dir.path().join("runs/mapped"), 2);
    let mut all = BTreeSet::new();
    for rank in &lines {
        let rows: usize = rank.iter().map(|l| l["ids"].as_array().unwrap().len()).sum();
        assert_eq!(rows, 20, "40 in-memory rows over 2 ranks");
        for l in rank {
            for (id, y) in l["ids"].as_array().unwrap().iter().zip(l["ys"].as_array().unwrap()) {
                let id = id.as_u64().unwrap();
                assert_eq!(y.as_f64().unwrap(), id as f64 * 2.0 + 1.0, "map_batches' column for row {id}");
                assert!(all.insert(id));
            }
        }
    }
}

#[test]
fn ddp_over_uneven_files_takes_as_many_steps_on_every_rank_and_does_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    data_py(dir.path(), &["ddp"]);
    let lines = rank_lines(&dir.path().join("runs/ddp"), 2);
    for e in 0..3u64 {
        let steps: Vec<u64> =
            lines.iter().map(|r| r.iter().find(|l| l["epoch"].as_u64() == Some(e)).unwrap()["steps"].as_u64().unwrap()).collect();
        // 101 rows: 50 a rank, 7 batches of 8 (the last of 2).
        assert_eq!(steps, [7, 7], "epoch {e}");
    }
}

#[test]
fn bad_data_sets_are_refused_before_any_trial_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for (what, wants) in [
        ("missing", vec!["datasets.train:", "nowhere.parquet does not exist"]),
        ("schema", vec!["datasets.train:", "part-9.parquet has columns id: string", "unlike"]),
        ("unreadable", vec!["datasets.train: cannot read", "part-5.parquet as parquet"]),
        ("notdataset", vec!["datasets['train'] is list: give a nestor.data Dataset"]),
    ] {
        let sub = dir.path().join(what);
        std::fs::create_dir_all(&sub).unwrap();
        let out = data_py(&sub, &["refuse", what]);
        let refused = line(&out, "REFUSED");
        for want in wants {
            assert!(refused.contains(want), "{what}: {refused}");
        }
        assert!(!sub.join("runs/refuse/store").exists(), "{what}: a store was created");
    }
}

#[test]
fn a_rank_killed_mid_epoch_restarts_the_trial_at_its_checkpoints_epoch_with_that_epochs_order() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("SLOW_S", "0.3".to_string())];
    let mut run = torch_python_cmd(dir.path(), "tests/py/data.py", &[dir.path().to_str().unwrap(), "resume", "killed"], &env)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let killed = dir.path().join("runs/killed");
    // Epochs 0 and 1 done; 0.3 s into epoch 2 (7 batches of 0.3 s), rank 1 is killed.
    wait_for_run("checkpoint 2 committed", 120.0, &mut run, || killed.join("trials/trial_00000/checkpoint_000002/.committed").exists());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let first = rank_lines(&killed, 2);
    let victim = u32::try_from(first[1].iter().find_map(|l| l.get("pid")).unwrap().as_u64().unwrap()).unwrap();
    signal(victim, libc::SIGKILL);
    let out = run.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    data_py(dir.path(), &["resume", "reference"]);
    let (k, r) = (rank_lines(&killed, 2), rank_lines(&dir.path().join("runs/reference"), 2));
    for rank in 0..2 {
        // The restarted run started at epoch 2, and every epoch read the uninterrupted run's rows in its order.
        let starts: Vec<u64> = k[rank].iter().filter_map(|l| l.get("start")).map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(starts, [0, 2], "rank {rank}");
        for e in 0..4u64 {
            let ids = |lines: &[Value]| lines.iter().rev().find(|l| l["epoch"].as_u64() == Some(e)).map(|l| l["ids"].clone());
            assert_eq!(ids(&k[rank]), ids(&r[rank]), "rank {rank} epoch {e}");
        }
    }
}

#[test]
fn the_split_holds_its_promises_on_random_layouts() {
    // A new seed every run (printed on failure, to replay the case).
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() % 1_000_000_007;
    let dir = tempfile::tempdir().unwrap();
    let out = passed(torch_python(dir.path(), "tests/py/split_property.py", &[&seed.to_string(), "2000"], &[]));
    assert!(out.contains("ok 2000 cases"), "seed {seed}: {out}");
}

#[test]
fn in_memory_sources_are_split_and_a_dataloader_reads_a_shard() {
    // pandas, NumPy, a list and a Hugging Face dataset (written once as
    // Parquet), each read through a torch DataLoader over the shard
    // (prepare_data_loader leaves an IterableDataset's split to it).
    let dir = tempfile::tempdir().unwrap();
    data_py(dir.path(), &["sources"]);
    let lines = rank_lines(&dir.path().join("runs/sources"), 2);
    for source in ["pandas", "numpy", "items", "huggingface"] {
        let mut all = BTreeSet::new();
        for rank in &lines {
            let l = rank.iter().find(|l| l["source"].as_str() == Some(source)).unwrap();
            let ids = l["ids"].as_array().unwrap();
            assert_eq!((ids.len(), l["count"].as_u64()), (15, Some(15)), "{source}");
            for id in ids {
                assert!(all.insert(id.as_u64().unwrap()), "{source}: row {id} twice");
            }
        }
        assert_eq!(all, (0..30).collect(), "{source}");
    }
    assert!(dir.path().join("runs/sources/driver/datasets/huggingface.parquet").is_file());
}

#[test]
fn a_data_set_in_an_object_store_is_split_as_a_local_one() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    let bucket = s3.root.join("bucket");
    let vars = s3.env();
    let env: Vec<(&str, String)> = vars.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    for (name, url) in [("prefix", "s3://bucket/data/"), ("glob", "s3://bucket/data/part-*.parquet")] {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        passed(torch_python(&sub, "tests/py/data.py", &[sub.to_str().unwrap(), "s3", bucket.to_str().unwrap(), url], &env));
        let by_epoch = epochs(&rank_lines(&sub.join("runs/s3"), 2), 2);
        for (e, ranks) in by_epoch.iter().enumerate() {
            let mut seen = BTreeSet::new();
            for ids in ranks {
                assert_eq!(ids.len(), 51, "{url} epoch {e}");
                assert!(ids.iter().all(|id| seen.insert(*id)), "{url} epoch {e}: a row twice");
            }
            assert_eq!(seen.len(), 102);
        }
    }
}

#[test]
fn the_data_example_sweeps_under_asha_with_each_worker_reading_half_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("EXAMPLE_STORAGE", dir.path().join("runs").display().to_string())];
    let out = passed(torch_python(dir.path(), "examples/python/tune_data.py", &[], &env));
    // 1,033 training rows over 2 workers: 516 each, the one left over moving on each epoch.
    assert!(line(&out, "best val_loss:").ends_with("516 training rows a worker an epoch"), "{out}");
    assert!(processes_mentioning(dir.path().to_str().unwrap()).is_empty(), "a worker survived");
}

#[test]
fn ranks_on_two_slurm_nodes_split_a_data_set_as_on_one() {
    let dir = tempfile::tempdir().unwrap();
    on_two_slurm_nodes("data.py", dir.path(), &["split", "2", "parquet", "shuffle", "3"]);
    let run = dir.path().join("runs/split-2-parquet-shuffle-0");
    let trial = trials(dir.path(), &run).remove(0);
    assert_eq!(trial["nodes"], serde_json::json!(["node1", "node2"]), "{trial}");
    let on_nodes = check_split(&run, 2, "parquet");
    // The same orders as the ranks computed on one machine.
    assert_eq!(on_nodes, split(2, "parquet", true));
}

#[test]
fn the_rust_split_draws_the_same_shares_and_orders_as_the_pythons() {
    use rand::{Rng, SeedableRng};
    // New cases every run (the seed printed on failure).
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let cases: Vec<Value> = (0..500)
        .map(|_| {
            let rows: Vec<u64> = (0..rng.random_range(0..10)).map(|_| rng.random_range(0..40)).collect();
            let world = rng.random_range(1..5u32);
            serde_json::json!({
                "rows": rows, "world": world, "rank": rng.random_range(0..world), "epoch": rng.random_range(0..50u64),
                "seed": rng.random::<u64>(), "shuffle": rng.random_bool(0.5), "split": rng.random_bool(0.9),
            })
        })
        .collect();
    let mut child = std::process::Command::new(torch_venv().join("bin/python"))
        .arg(repo().join("tests/py/split_cases.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(serde_json::to_string(&cases).unwrap().as_bytes()).unwrap();
    }
    let python: Vec<Value> = serde_json::from_str(&passed(child.wait_with_output().unwrap())).unwrap();
    for (c, p) in cases.iter().zip(&python) {
        let rows: Vec<u64> = c["rows"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        let (world, rank) = (c["world"].as_u64().unwrap() as u32, c["rank"].as_u64().unwrap() as u32);
        let (epoch, s) = (c["epoch"].as_u64().unwrap(), c["seed"].as_u64().unwrap());
        let pieces = trainer::split::share(&rows, world, rank, epoch, s, c["shuffle"].as_bool().unwrap(), c["split"].as_bool().unwrap());
        let ours: Vec<[u64; 3]> = pieces.iter().map(|p| [p.block as u64, p.start, p.end]).collect();
        assert_eq!(serde_json::json!(ours), p["pieces"], "seed {seed}: case {c}");
        let perm = trainer::split::permutation(37, s, epoch, u64::from(rank));
        assert_eq!(serde_json::json!(perm), p["perm"], "seed {seed}: the permutation of case {c}");
    }
}

#[test]
fn train_test_split_and_limit_cut_the_rows_as_ray_does_and_ranks_read_their_parts() {
    let dir = tempfile::tempdir().unwrap();
    let out = data_py(dir.path(), &["subsets"]);
    let subset: Value = serde_json::from_str(line(&out, "SUBSET")).unwrap();
    let ids = |k: &str| -> Vec<u64> { subset[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect() };
    // 103 rows, a test fraction of 0.25: int(103 * 0.25) = 25 test rows, the last ones.
    assert_eq!(ids("train"), (0..78).collect::<Vec<_>>());
    assert_eq!(ids("test"), (78..103).collect::<Vec<_>>());
    let (a, b) = (ids("a"), ids("b"));
    assert_eq!((a.len(), b.len()), (78, 25));
    let all: BTreeSet<u64> = a.iter().chain(&b).copied().collect();
    assert_eq!(all, (0..103).collect(), "the shuffled split covers every row once");
    assert_ne!(b, (78..103).collect::<Vec<_>>(), "shuffled: not the last rows");
    assert_eq!(ids("again"), a, "the same seed, the same split");
    assert_ne!(ids("other"), a, "another seed, another split");
    assert_eq!(ids("limit"), (0..10).collect::<Vec<_>>());
    assert_eq!(subset["counts"], serde_json::json!([78, 25]));
    assert!(line(&out, "MISSING").contains("Dataset has no write_parquet() (ray.data.Dataset.write_parquet)"), "{out}");
    // The run: train (78 rows) split across 2 ranks, test (25) read whole by each.
    let lines = rank_lines(&dir.path().join("runs/subsets"), 2);
    let mut train_rows = BTreeSet::new();
    for rank in &lines {
        let part = |name: &str| rank.iter().find(|l| l["name"].as_str() == Some(name)).unwrap().clone();
        let (t, v) = (part("train"), part("test"));
        assert_eq!(t["count"].as_u64(), Some(39));
        for id in t["ids"].as_array().unwrap() {
            assert!(a.contains(&id.as_u64().unwrap()) && train_rows.insert(id.as_u64().unwrap()), "train row {id}");
        }
        let test: BTreeSet<u64> = v["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(test, b.iter().copied().collect(), "every rank reads the whole test part");
    }
    assert_eq!(train_rows.len(), 78);
}
