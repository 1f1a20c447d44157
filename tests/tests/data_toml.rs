//! `[datasets]` in an experiment file: the `nestor` binary plans the data
//! sets with Arrow's readers, and ranks read their shares, Rust ones with
//! nestor-data's `dataset_shard` (the fixture worker's `dataset` mode) and
//! Python ones with `nestor.get_dataset_shard`, the same rows in the same
//! orders as a `TorchTrainer(datasets=...)` planned in Python.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::data::*;
use common::*;

/// An experiment file whose one trial reads `train` (`dataset`, a TOML
/// value) on `workers` fixture ranks for `epochs` epochs.
fn data_sweep(name: &str, workers: u32, dataset: &str, epochs: u64, extra: &str) -> String {
    format!(
        r#"[experiment]
name = "{name}"
num_samples = 1
seed = 0

[space]
dataset = "train"
steps = {epochs}

[datasets]
train = {dataset}

[trainer]
command = ["{}"]
num_workers = {workers}
resources_per_worker = {{ CPU = 0.5 }}
grace_period_s = 1.0
{extra}
"#,
        worker()
    )
}

/// Runs the sweep in `dir`; the run's directory.
fn run(dir: &Path, text: &str, env: &[(String, String)]) -> std::path::PathBuf {
    write(dir, text);
    ok(nestor_env(dir, &["run", "sweep.toml", "--storage", "runs", "--plain"], env));
    let name = text.lines().find_map(|l| l.strip_prefix("name = ")).unwrap().trim_matches('"');
    dir.join("runs").join(name)
}

/// 103 rows in 3 files of `format` over `workers` Rust ranks, 3 epochs: the split's promises; each epoch's ids per rank.
fn rust_split(workers: u32, format: &str, shuffle: bool) -> Vec<Vec<Vec<u64>>> {
    let dir = tempfile::tempdir().unwrap();
    let folder = write_rows(dir.path(), format, &[37, 50, 16]);
    let dataset = format!("{{ path = {:?}, format = {format:?}, shuffle = {shuffle} }}", folder.display().to_string());
    let run = run(dir.path(), &data_sweep("split", workers, &dataset, 3, ""), &[]);
    let by_epoch = check_split(&run, workers, format);
    assert_eq!(rank_lines(&run, workers)[0][0]["plan_seen"], true);
    for rank in rank_lines(&run, workers) {
        let count = rank.iter().find_map(|l| l.get("count")).unwrap().as_u64().unwrap();
        assert_eq!(count, 103 / u64::from(workers), "{format}: count()");
    }
    by_epoch
}

#[test]
fn rust_ranks_split_parquet_csv_and_json_files_evenly_with_no_row_twice() {
    for (workers, format) in [(1, "parquet"), (2, "parquet"), (3, "parquet"), (2, "csv"), (3, "json")] {
        for ranks in rust_split(workers, format, false) {
            for ids in ranks {
                assert!(ids.windows(2).all(|w| w[0] < w[1]), "{format}: unshuffled rows come in the files' order: {ids:?}");
            }
        }
    }
}

#[test]
fn a_shuffled_data_set_has_a_new_order_every_epoch_and_the_same_orders_for_a_seed_in_rust_ranks() {
    let first = rust_split(3, "parquet", true);
    assert_eq!(first, rust_split(3, "parquet", true), "the same seed gives the same orders");
    assert_ne!(first[0], first[1], "epoch 1's order is epoch 0's");
    assert_ne!(first[1], first[2]);
    let json = rust_split(2, "json", true);
    assert_ne!(json[0], json[1]);
}

#[test]
fn rust_and_python_ranks_of_a_toml_sweep_read_what_a_python_trainer_reads() {
    // The Python driver plans and its ranks read (TorchTrainer(datasets=...),
    // seed 0), then the nestor binary plans the same files (seed 0) for Rust
    // ranks and for Python ranks: the same rows, in the same orders.
    use common::python::*;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    passed(torch_python(dir.path(), "tests/py/data.py", &[root, "split", "2", "parquet", "shuffle", "3"], &[]));
    let python_trainer = check_split(&dir.path().join("runs/split-2-parquet-shuffle-0"), 2, "parquet");
    let dataset = format!("{{ path = {:?}, shuffle = true }}", dir.path().join("rows-parquet/*.parquet").display().to_string());
    let rust = run(dir.path(), &data_sweep("rust", 2, &dataset, 3, ""), &[]);
    assert_eq!(check_split(&rust, 2, "parquet"), python_trainer, "Rust ranks");
    let python = torch_venv().join("bin/python").display().to_string();
    let script = repo().join("tests/py/toml_data_worker.py").display().to_string();
    let text = data_sweep("python", 2, &dataset, 3, "")
        .replace(&format!("command = [\"{}\"]", worker()), &format!("command = [{python:?}, {script:?}]"));
    let env = [("PYTHONPATH".to_string(), repo().join("python").display().to_string())];
    let py = run(dir.path(), &text, &env);
    assert_eq!(check_split(&py, 2, "parquet"), python_trainer, "Python ranks of a TOML sweep");
}

#[test]
fn bad_data_sets_in_an_experiment_file_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let folder = write_rows(dir.path(), "parquet", &[5, 5]);
    let odd = dir.path().join("odd");
    std::fs::create_dir_all(&odd).unwrap();
    std::fs::copy(folder.join("part-0.parquet"), odd.join("part-0.parquet")).unwrap();
    let strings = write_rows(&dir.path().join("strings"), "csv", &[3]);
    let text = std::fs::read_to_string(strings.join("part-0.csv")).unwrap().replace("id,x", "id,y");
    std::fs::write(odd.join("part-1.csv"), text).unwrap();
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(folder.join("part-0.parquet"), bad.join("part-0.parquet")).unwrap();
    std::fs::write(bad.join("part-1.parquet"), "not parquet").unwrap();
    let csv_dir = write_rows(dir.path(), "csv", &[4, 4]);
    std::fs::write(csv_dir.join("part-2.csv"), "name\nx\n").unwrap();
    let p = |path: &Path| format!("{:?}", path.display().to_string());
    for (what, dataset, wants) in [
        ("missing", p(&dir.path().join("nowhere.parquet")), vec!["datasets.train", "nowhere.parquet does not exist"]),
        ("glob", p(&dir.path().join("rows-parquet/*.pq")), vec!["datasets.train", "no file matches", "*.pq"]),
        ("empty", p(&dir.path().join("strings")), vec!["datasets.train", "holds no parquet file"]),
        ("unreadable", p(&bad), vec!["datasets.train", "cannot read", "part-1.parquet as parquet"]),
        (
            "columns",
            format!("{{ path = [{}, {}] }}", p(&folder.join("part-0.parquet")), p(&odd.join("part-1.csv"))),
            vec!["datasets.train", "files of different formats"],
        ),
        (
            "schema",
            format!("{{ path = {}, format = \"csv\" }}", p(&csv_dir)),
            vec!["datasets.train", "part-2.csv has columns name: Utf8", "unlike"],
        ),
        ("key", format!("{{ path = {}, shufle = true }}", p(&folder)), vec!["sweep.toml: line 11", "unknown field `shufle`"]),
    ] {
        let sub = dir.path().join(format!("case-{what}"));
        std::fs::create_dir_all(&sub).unwrap();
        write(&sub, &data_sweep(what, 2, &dataset, 1, ""));
        let out = nestor(&sub, &["run", "sweep.toml", "--storage", "runs", "--plain"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: ran");
        for want in wants {
            assert!(stderr.contains(want), "{what}: {want:?} not in {stderr}");
        }
        assert!(!sub.join(format!("runs/{what}/store")).exists(), "{what}: a store was written");
        assert!(!sub.join(format!("runs/{what}/trials")).exists(), "{what}: a trial ran");
    }
}

#[test]
fn rust_ranks_read_a_data_set_in_an_object_store_by_prefix_and_by_glob() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    let folder = write_rows(dir.path(), "parquet", &[37, 50, 16]);
    let data = s3.root.join("bucket/data");
    std::fs::create_dir_all(&data).unwrap();
    for e in std::fs::read_dir(&folder).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), data.join(e.file_name())).unwrap();
    }
    for (name, url) in [("prefix", "s3://bucket/data/"), ("glob", "s3://bucket/data/part-*.parquet")] {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let run = run(&sub, &data_sweep(name, 2, &format!("{{ path = {url:?}, shuffle = true }}"), 3, ""), &s3.env());
        check_split(&run, 2, "parquet");
        let plan = read(&run.join("datasets.json"));
        assert!(plan.contains("\"s3://bucket/data/part-1.parquet\""), "{plan}");
    }
}

#[test]
fn a_rust_rank_failing_mid_sweep_restarts_at_its_checkpoints_epoch_with_that_epochs_order() {
    let dir = tempfile::tempdir().unwrap();
    let folder = write_rows(dir.path(), "parquet", &[37, 50, 16]);
    let dataset = format!("{{ path = {:?}, shuffle = true }}", folder.display().to_string());
    let failure = "[failure]\nmax_failures = 1\n";
    // Rank 1 fails in epoch 2 (after reading it), in the run that did not start from a checkpoint.
    let text =
        data_sweep("failed", 2, &dataset, 4, failure).replace("steps = 4", "steps = 4\ncheckpoint = true\nfail_at = 3\nfail_rank = 1");
    let failed = run(dir.path(), &text, &[]);
    let reference =
        run(dir.path(), &data_sweep("reference", 2, &dataset, 4, failure).replace("steps = 4", "steps = 4\ncheckpoint = true"), &[]);
    let (f, r) = (rank_lines(&failed, 2), rank_lines(&reference, 2));
    for rank in 0..2 {
        let starts: Vec<u64> = f[rank].iter().filter_map(|l| l.get("start")).map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(starts, [0, 2], "rank {rank}: the restart began at the checkpoint's epoch");
        for e in 0..4u64 {
            let ids = |lines: &[serde_json::Value]| lines.iter().rev().find(|l| l["epoch"].as_u64() == Some(e)).map(|l| l["ids"].clone());
            assert_eq!(ids(&f[rank]), ids(&r[rank]), "rank {rank} epoch {e}");
        }
    }
}

#[test]
fn ranks_on_two_slurm_nodes_that_do_not_see_the_experiment_fetch_the_plan_and_split_as_on_one() {
    // The nodes see the data's directory but not the experiment's (an empty
    // tmpfs over it): each rank fetches datasets.json from the driver.
    let hidden = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let s3 = S3Server::start(&dir.path().join("s3"));
    let options = common::slurm::Options {
        networks: true,
        hidden: vec![(0, hidden.path().to_path_buf()), (1, hidden.path().to_path_buf())],
        ..Default::default()
    };
    let cluster = common::slurm::SlurmCluster::start_with(2, 2, 2000, options);
    let local = hidden.path().join("local");
    let folder = write_rows(dir.path(), "parquet", &[37, 50, 16]);
    let dataset = format!("{{ path = {:?}, shuffle = true }}", folder.display().to_string());
    let text = data_sweep("nodes", 2, &dataset, 3, "placement_strategy = \"STRICT_SPREAD\"")
        .replace("seed = 0", &format!("seed = 0\nstorage = \"s3://bucket/runs\"\nlocal_dir = \"{}\"", local.display()));
    write(dir.path(), &text);
    let out = cluster
        .cmd("salloc")
        .args(["-N2", "--ntasks-per-node=2", "--mem=1000"])
        .arg(nestor_bin())
        .args(["run", "sweep.toml", "--plain"])
        .envs(s3.env())
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = ok(out);
    assert!(stdout.contains("1 trial (1 TERMINATED)"), "{stdout}\n{stderr}");
    assert!(stderr.contains("is not shared with node1, node2"), "{stderr}");
    let run = local.join("nodes");
    let on_nodes = check_split(&run, 2, "parquet");
    for rank in rank_lines(&run, 2) {
        assert_eq!(rank[0]["plan_seen"], false, "a node saw the experiment's directory: {rank:?}");
    }
    let trial = common::python::trials(dir.path(), &run).remove(0);
    assert_eq!(trial["nodes"], serde_json::json!(["node1", "node2"]), "{trial}");
    // The same orders as ranks on one machine that read the plan's file.
    assert_eq!(on_nodes, rust_split(2, "parquet", true));
}

#[test]
fn a_sweep_resumed_after_its_driver_was_killed_reads_the_same_plan_and_goes_on_at_the_checkpoints_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let folder = write_rows(dir.path(), "parquet", &[37, 50, 16]);
    let dataset = format!("{{ path = {:?}, shuffle = true }}", folder.display().to_string());
    let reference = run(dir.path(), &data_sweep("reference", 2, &dataset, 4, "").replace("steps = 4", "steps = 4\ncheckpoint = true"), &[]);
    // 7 batches of 100 ms an epoch; the driver is killed once epoch 2's checkpoint is committed.
    write(dir.path(), &data_sweep("killed", 2, &dataset, 4, "").replace("steps = 4", "steps = 4\ncheckpoint = true\nsleep_ms = 100"));
    let mut driver = spawn_run(dir.path());
    let killed = dir.path().join("runs/killed");
    wait_for_run("checkpoint 2 committed", 60.0, &mut driver, || killed.join("trials/trial_00000/checkpoint_000002/.committed").exists());
    signal(driver.id(), libc::SIGKILL);
    driver.wait().unwrap();
    // A file added after the sweep began: the resumed sweep reads the plan it made, without it.
    std::fs::write(folder.join("part-3.parquet"), std::fs::read(folder.join("part-0.parquet")).unwrap()).unwrap();
    let plan = read(&killed.join("datasets.json"));
    ok(nestor(dir.path(), &["resume", "runs/killed", "--plain"]));
    assert_eq!(read(&killed.join("datasets.json")), plan);
    let (k, r) = (rank_lines(&killed, 2), rank_lines(&reference, 2));
    for rank in 0..2 {
        let starts: Vec<u64> = k[rank].iter().filter_map(|l| l.get("start")).map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(starts.last(), Some(&2), "rank {rank}: the resumed run began at the checkpoint's epoch: {starts:?}");
        for e in 0..4u64 {
            let ids = |lines: &[serde_json::Value]| lines.iter().rev().find(|l| l["epoch"].as_u64() == Some(e)).map(|l| l["ids"].clone());
            assert_eq!(ids(&k[rank]), ids(&r[rank]), "rank {rank} epoch {e}");
        }
    }
}
