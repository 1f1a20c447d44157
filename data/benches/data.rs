//! Rows a second delivered to one Rust rank by `DataShard::iter_batches`
//! (Arrow record batches of 1,024 rows), against Arrow's own Parquet reader
//! over the same file: 2,000,000 rows of 8 float columns and a label in row
//! groups of 65,536, as `python/benches/data.py` writes for the Python
//! client, and a tenth of the rows as one CSV file. Each case three times;
//! the median and the range.
//!
//! ```text
//! cargo bench -p nestor-data --bench data [-- --rows N]
//! ```

#![allow(clippy::unwrap_used, clippy::type_complexity)]

use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, Float32Array, Int64Array, RecordBatch};
use data::{Block, DataPlan, DataShard, DatasetSpec, Format, Paths};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rows: usize =
        args.iter().position(|a| a == "--rows").and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(2_000_000);
    let dir = std::env::temp_dir().join(format!("nestor-bench-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bench.parquet");
    write(&path, rows);
    let meta = parquet::file::reader::FileReader::metadata(
        &parquet::file::reader::SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap(),
    )
    .clone();
    let blocks: Vec<Block> = (0..meta.num_row_groups())
        .map(|i| Block {
            path: path.display().to_string(),
            format: Format::Parquet,
            rows: meta.row_group(i).num_rows() as u64,
            row_group: Some(i),
            columns: Vec::new(),
        })
        .collect();
    println!("{rows} rows, {} row groups, batches of 1,024", blocks.len());
    let plan = |shuffle: bool| Arc::new(DataPlan { blocks: blocks.clone(), shuffle, seed: 0, split: true });
    // The same rows as CSV, a tenth of them (text is ten times the bytes): a
    // CSV block is read and parsed whole (arrow-csv, its numbers through arrow-cast).
    let csv_rows = rows / 10;
    let csv_path = dir.join("bench.csv");
    write_csv(&path, &csv_path, csv_rows);
    // Planned as the driver plans it (the columns found once, in the plan)...
    let specs = std::collections::BTreeMap::from([("bench".to_string(), DatasetSpec::Path(Paths::One(csv_path.display().to_string())))]);
    let planned = tokio::runtime::Runtime::new().unwrap().block_on(data::plan_all(&specs, 0)).unwrap();
    let csv_plan = Arc::new(planned.datasets["bench"].clone());
    assert!(!csv_plan.blocks[0].columns.is_empty(), "the plan names the CSV file's columns");
    // ... and as a plan without them (an older driver's), the rank finding them itself.
    let mut unnamed = (*csv_plan).clone();
    unnamed.blocks[0].columns.clear();
    let csv_unnamed = Arc::new(unnamed);
    let cases: Vec<(&str, Box<dyn Fn() -> usize>)> = vec![
        (
            "parquet's ParquetRecordBatchReader",
            Box::new(|| {
                let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap())
                    .unwrap()
                    .with_batch_size(1024)
                    .build()
                    .unwrap();
                reader.map(|b| b.unwrap().num_rows()).sum()
            }),
        ),
        (
            "DataShard::iter_batches",
            Box::new(|| DataShard::new("bench", plan(false), 0, 1, 0).iter_batches(1024).map(|b| b.unwrap().num_rows()).sum()),
        ),
        (
            "DataShard::iter_batches, shuffled",
            Box::new(|| DataShard::new("bench", plan(true), 0, 1, 0).iter_batches(1024).map(|b| b.unwrap().num_rows()).sum()),
        ),
        (
            "DataShard::iter_batches, a tenth (rank 0 of 10)",
            Box::new(|| DataShard::new("bench", plan(false), 0, 10, 0).iter_batches(1024).map(|b| b.unwrap().num_rows()).sum()),
        ),
        (
            "DataShard::iter_batches, CSV (a tenth of the rows)",
            Box::new(|| DataShard::new("bench", Arc::clone(&csv_plan), 0, 1, 0).iter_batches(1024).map(|b| b.unwrap().num_rows()).sum()),
        ),
        (
            "the same, columns found by the rank",
            Box::new(|| DataShard::new("bench", Arc::clone(&csv_unnamed), 0, 1, 0).iter_batches(1024).map(|b| b.unwrap().num_rows()).sum()),
        ),
    ];
    for (name, case) in &cases {
        let mut rates: Vec<f64> = (0..3)
            .map(|_| {
                let t = Instant::now();
                let n = case();
                n as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        println!("{name:<52} {:>6.2} M rows/s ({:.2}-{:.2})", rates[1] / 1e6, rates[0] / 1e6, rates[2] / 1e6);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The first `rows` rows of the Parquet file at `from`, as CSV with a header.
fn write_csv(from: &std::path::Path, to: &std::path::Path, rows: usize) {
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(from).unwrap())
        .unwrap()
        .with_limit(rows)
        .build()
        .unwrap();
    let mut w = arrow_csv::Writer::new(std::fs::File::create(to).unwrap());
    for batch in reader {
        w.write(&batch.unwrap()).unwrap();
    }
}

fn write(path: &std::path::Path, rows: usize) {
    let mut state = 7u64;
    let mut next = move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut columns: Vec<(String, ArrayRef)> =
        (0..8).map(|c| (format!("f{c}"), Arc::new(Float32Array::from_iter_values((0..rows).map(|_| next()))) as ArrayRef)).collect();
    columns.push(("label".into(), Arc::new(Int64Array::from_iter_values((0..rows as i64).map(|i| i % 10)))));
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let props = parquet::file::properties::WriterProperties::builder().set_max_row_group_row_count(Some(65_536)).build();
    let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}
