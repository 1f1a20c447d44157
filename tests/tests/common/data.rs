//! What the data tests share: the ranks' `RANK` lines and the promises of the split.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use super::read;

/// The `RANK` lines of every rank of a run's one trial.
pub fn rank_lines(run: &Path, ranks: u32) -> Vec<Vec<Value>> {
    (0..ranks)
        .map(|r| {
            let log = read(&run.join(format!("trials/trial_00000/logs/rank-{r}.log")));
            log.lines().filter_map(|l| l.strip_prefix("RANK ")).map(|l| serde_json::from_str(l).unwrap()).collect()
        })
        .collect()
}

/// Each epoch's ids, per rank, in reading order.
pub fn epochs(lines: &[Vec<Value>], n: usize) -> Vec<Vec<Vec<u64>>> {
    (0..n)
        .map(|e| {
            lines
                .iter()
                .map(|rank| {
                    let line = rank.iter().find(|l| l["epoch"].as_u64() == Some(e as u64)).unwrap();
                    line["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect()
                })
                .collect()
        })
        .collect()
}

/// The promises of the split, on a run of 103 rows over `workers` ranks, 3 epochs.
pub fn check_split(run: &Path, workers: u32, format: &str) -> Vec<Vec<Vec<u64>>> {
    let by_epoch = epochs(&rank_lines(run, workers), 3);
    let per = 103 / u64::from(workers);
    let mut left_before: Option<BTreeSet<u64>> = None;
    for (e, ranks) in by_epoch.iter().enumerate() {
        let mut seen = BTreeSet::new();
        for (r, ids) in ranks.iter().enumerate() {
            assert_eq!(ids.len() as u64, per, "{format} epoch {e}: rank {r} read {} rows, not {per}", ids.len());
            for id in ids {
                assert!(*id < 103 && seen.insert(*id), "{format} epoch {e}: row {id} read twice");
            }
        }
        let left: BTreeSet<u64> = (0..103).filter(|i| !seen.contains(i)).collect();
        assert_eq!(left.len() as u64, 103 - per * u64::from(workers));
        if let Some(before) = &left_before {
            assert!(left.is_disjoint(before) || left.is_empty(), "epoch {e} left out {left:?} again");
        }
        left_before = Some(left);
    }
    by_epoch
}

/// Files of `sizes` rows each in `dir/rows-<format>/` (`id` counting up
/// across them, `x = id / 10`), as the Python tests write them: Parquet
/// in row groups of 10, CSV with a header, JSON a row a line.
pub fn write_rows(dir: &Path, format: &str, sizes: &[u64]) -> std::path::PathBuf {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch};

    let folder = dir.join(format!("rows-{format}"));
    std::fs::create_dir_all(&folder).unwrap();
    let mut start = 0i64;
    for (i, &n) in sizes.iter().enumerate() {
        let ids: Vec<i64> = (start..start + n as i64).collect();
        let path = folder.join(format!("part-{i}.{}", if format == "json" { "jsonl" } else { format }));
        match format {
            "parquet" => {
                let id: ArrayRef = Arc::new(Int64Array::from(ids.clone()));
                let x: ArrayRef = Arc::new(Float64Array::from(ids.iter().map(|&i| i as f64 / 10.0).collect::<Vec<_>>()));
                let batch = RecordBatch::try_from_iter([("id", id), ("x", x)]).unwrap();
                let props = parquet::file::properties::WriterProperties::builder().set_max_row_group_row_count(Some(10)).build();
                let file = std::fs::File::create(&path).unwrap();
                let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
                writer.write(&batch).unwrap();
                writer.close().unwrap();
            }
            "csv" => {
                let body: String = ids.iter().map(|i| format!("{i},{}\n", *i as f64 / 10.0)).collect();
                std::fs::write(&path, format!("id,x\n{body}")).unwrap();
            }
            _ => {
                let body: String = ids.iter().map(|i| format!("{{\"id\": {i}, \"x\": {}}}\n", *i as f64 / 10.0)).collect();
                std::fs::write(&path, body).unwrap();
            }
        }
        start += n as i64;
    }
    folder
}
