//! A rank's side: its share of a data set, read epoch after epoch in the
//! background (the same shares and orders as the Python client's).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use futures_util::TryStreamExt;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use crate::plan::Stores;
use trainer::data::{Block, DataError, DataPlan, Format};
use trainer::split::{permutation, rows_per_rank, share, Piece};

/// How [`DataShard::iter_batches_with`] cuts an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    /// Rows a batch (the last may hold fewer).
    pub batch_size: usize,
    /// Leave out the last batch when it holds fewer than `batch_size` rows.
    pub drop_last: bool,
    /// Pieces read ahead of the consumer.
    pub prefetch: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        Self { batch_size: 256, drop_last: false, prefetch: 2 }
    }
}

/// This rank's share of one data set (Ray's `DataIterator`): each
/// [`iter_batches`](Self::iter_batches) is the next epoch, as Arrow
/// record batches. Every rank reads as many rows an epoch, no row reaches
/// two ranks, and a shuffled set has a new seeded order every epoch.
#[derive(Debug, Clone)]
pub struct DataShard {
    name: String,
    plan: Arc<DataPlan>,
    rank: u32,
    world: u32,
    epoch: u64,
}

impl DataShard {
    /// Rank `rank` of `world`'s share of `plan`, starting at `epoch`.
    ///
    /// # Panics
    ///
    /// When `rank >= world`.
    pub fn new(name: impl Into<String>, plan: Arc<DataPlan>, rank: u32, world: u32, epoch: u64) -> Self {
        assert!(rank < world, "rank {rank} of a world of {world}");
        Self { name: name.into(), plan, rank, world, epoch }
    }

    /// The data set's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many rows this rank reads an epoch (the same on every rank).
    pub fn count(&self) -> u64 {
        rows_per_rank(self.plan.rows(), self.world, self.plan.split)
    }

    /// The epoch the next `iter_batches` reads.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The pieces of blocks this rank reads in `epoch`.
    pub fn pieces(&self, epoch: u64) -> Vec<Piece> {
        let rows: Vec<u64> = self.plan.blocks.iter().map(|b| b.rows).collect();
        share(&rows, self.world, self.rank, epoch, self.plan.seed, self.plan.shuffle, self.plan.split)
    }

    /// The next epoch's rows in batches of `batch_size`.
    pub fn iter_batches(&mut self, batch_size: usize) -> Batches {
        self.iter_batches_with(BatchOptions { batch_size, ..BatchOptions::default() })
    }

    /// The next epoch's rows, cut as `options` say.
    pub fn iter_batches_with(&mut self, options: BatchOptions) -> Batches {
        let epoch = self.epoch;
        self.epoch += 1;
        let (tx, rx) = sync_channel(options.prefetch.max(1));
        let pieces = self.pieces(epoch);
        let plan = Arc::clone(&self.plan);
        let spawned =
            std::thread::Builder::new().name(format!("nestor-data-{}", self.name)).spawn(move || produce(&plan, &pieces, epoch, &tx));
        let failed = spawned.err().map(|e| DataError::Read { path: self.name.clone(), message: format!("cannot start the reader: {e}") });
        Batches { rx, options, pending: std::collections::VecDeque::new(), held: 0, done: false, failed }
    }
}

/// One epoch of a [`DataShard`], read ahead on a thread of its own.
pub struct Batches {
    rx: Receiver<Result<RecordBatch, DataError>>,
    options: BatchOptions,
    pending: std::collections::VecDeque<RecordBatch>,
    held: usize,
    done: bool,
    failed: Option<DataError>,
}

impl std::fmt::Debug for Batches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batches").field("options", &self.options).field("held", &self.held).finish_non_exhaustive()
    }
}

impl Batches {
    /// The first `n` held rows as one batch (a slice of the first batch read
    /// when it holds them: no copy); the rest stay.
    fn cut(&mut self, n: usize) -> Result<RecordBatch, DataError> {
        let mut parts = Vec::new();
        let mut need = n.min(self.held);
        while need > 0 {
            let Some(front) = self.pending.pop_front() else { break };
            let take = need.min(front.num_rows());
            parts.push(front.slice(0, take));
            if take < front.num_rows() {
                self.pending.push_front(front.slice(take, front.num_rows() - take));
            }
            need -= take;
        }
        let rows: usize = parts.iter().map(RecordBatch::num_rows).sum();
        self.held -= rows;
        if parts.len() == 1 {
            return Ok(parts.remove(0));
        }
        let schema: SchemaRef = parts[0].schema();
        arrow_select::concat::concat_batches(&schema, &parts)
            .map_err(|e| DataError::Read { path: "<batch>".into(), message: e.to_string() })
    }
}

impl Iterator for Batches {
    type Item = Result<RecordBatch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.failed.take() {
            self.done = true;
            return Some(Err(e));
        }
        let size = self.options.batch_size.max(1);
        while !self.done && self.held < size {
            match self.rx.recv() {
                Ok(Ok(batch)) => {
                    self.held += batch.num_rows();
                    if batch.num_rows() > 0 {
                        self.pending.push_back(batch);
                    }
                }
                Ok(Err(e)) => {
                    self.done = true;
                    self.pending.clear();
                    self.held = 0;
                    return Some(Err(e));
                }
                Err(_) => self.done = true,
            }
        }
        if self.held == 0 || (self.held < size && self.options.drop_last) {
            return None;
        }
        Some(self.cut(size))
    }
}

/// Reads the pieces in order and sends them; stops when the consumer is gone.
fn produce(plan: &DataPlan, pieces: &[Piece], epoch: u64, tx: &SyncSender<Result<RecordBatch, DataError>>) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = tx.send(Err(DataError::Read { path: "<runtime>".into(), message: e.to_string() }));
            return;
        }
    };
    let mut stores = Stores::default();
    // A shuffled block is read whole and permuted; kept for its next piece.
    let mut cached: Option<(usize, RecordBatch)> = None;
    for piece in pieces {
        let block = &plan.blocks[piece.block];
        let read = if plan.shuffle {
            let whole = match cached.take() {
                Some((b, batch)) if b == piece.block => Ok(batch),
                _ => read_rows(&rt, &mut stores, block, 0, block.rows).and_then(|batches| {
                    let batch = concat(block, &batches)?;
                    let order = permutation(batch.num_rows(), plan.seed, epoch, piece.block as u64);
                    let idx = UInt32Array::from_iter_values(order.into_iter().map(|i| i as u32));
                    arrow_select::take::take_record_batch(&batch, &idx).map_err(|e| read_error(block, e))
                }),
            };
            whole.map(|whole| {
                let out = whole.slice(piece.start as usize, (piece.end - piece.start) as usize);
                cached = Some((piece.block, whole));
                vec![out]
            })
        } else {
            let mut gone = false;
            let streamed = stream_rows(&rt, &mut stores, block, piece.start, piece.end, &mut |b| {
                gone = tx.send(Ok(b)).is_err();
                !gone
            });
            if gone {
                return;
            }
            streamed.map(|()| Vec::new())
        };
        match read {
            Ok(batches) => {
                for b in batches {
                    if tx.send(Ok(b)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

fn read_error(block: &Block, e: impl std::fmt::Display) -> DataError {
    DataError::Read { path: block.path.clone(), message: e.to_string() }
}

fn concat(block: &Block, batches: &[RecordBatch]) -> Result<RecordBatch, DataError> {
    match batches {
        [one] => Ok(one.clone()),
        _ => {
            let schema = batches.first().map(RecordBatch::schema).ok_or_else(|| read_error(block, "no rows"))?;
            arrow_select::concat::concat_batches(&schema, batches).map_err(|e| read_error(block, e))
        }
    }
}

/// Rows of a Parquet file's row group: a selection of them read, no more
/// (none when the piece is the whole group: the reader's fastest path).
fn parquet_selection(block: &Block, start: usize, len: usize) -> (Vec<usize>, Option<RowSelection>) {
    let whole = start == 0 && len as u64 == block.rows;
    (vec![block.row_group.unwrap_or(0)], (!whole).then(|| RowSelection::from(vec![RowSelector::skip(start), RowSelector::select(len)])))
}

/// Rows `start..end` of a block, in batches of at most 8,192.
fn read_rows(
    rt: &tokio::runtime::Runtime,
    stores: &mut Stores,
    block: &Block,
    start: u64,
    end: u64,
) -> Result<Vec<RecordBatch>, DataError> {
    let mut out = Vec::new();
    stream_rows(rt, stores, block, start, end, &mut |b| {
        out.push(b);
        true
    })?;
    Ok(out)
}

/// Rows `start..end` of a block, each batch (at most 8,192 rows) handed
/// to `emit` as it is read, until it returns false: a local Parquet file
/// through Arrow's synchronous reader, one in an object store by ranges
/// (its footer, then the column chunks).
fn stream_rows(
    rt: &tokio::runtime::Runtime,
    stores: &mut Stores,
    block: &Block,
    start: u64,
    end: u64,
    emit: &mut dyn FnMut(RecordBatch) -> bool,
) -> Result<(), DataError> {
    const BATCH: usize = 8192;
    let (start, len) = (start as usize, (end - start) as usize);
    let batches: Vec<RecordBatch> = match block.format {
        Format::Parquet if !crate::plan::is_url(&block.path) => {
            let file = std::fs::File::open(block.path.strip_prefix("file://").unwrap_or(&block.path)).map_err(|e| read_error(block, e))?;
            let (groups, selection) = parquet_selection(block, start, len);
            let mut builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| read_error(block, e))?
                .with_row_groups(groups)
                .with_batch_size(BATCH);
            if let Some(selection) = selection {
                builder = builder.with_row_selection(selection);
            }
            let mut rows = 0;
            for batch in builder.build().map_err(|e| read_error(block, e))? {
                let batch = batch.map_err(|e| read_error(block, e))?;
                rows += batch.num_rows();
                if !emit(batch) {
                    return Ok(());
                }
            }
            return counted(block, rows, len);
        }
        Format::Parquet => rt.block_on(async {
            let reader = stores.parquet(&block.path).await.map_err(|e| read_error(block, e))?;
            let (groups, selection) = parquet_selection(block, start, len);
            let mut builder = ParquetRecordBatchStreamBuilder::new(reader)
                .await
                .map_err(|e| read_error(block, e))?
                .with_row_groups(groups)
                .with_batch_size(BATCH);
            if let Some(selection) = selection {
                builder = builder.with_row_selection(selection);
            }
            let stream = builder.build().map_err(|e| read_error(block, e))?;
            stream.try_collect().await.map_err(|e| read_error(block, e))
        })?,
        Format::Csv | Format::Json => {
            let bytes = rt.block_on(stores.bytes(&block.path)).map_err(|e| read_error(block, e))?;
            // The columns the driver found; found again here only for a plan without them.
            let schema = match crate::plan::schema_of(&block.columns) {
                Some(known) => known,
                None => crate::plan::infer(&bytes, block.format).map_err(|e| read_error(block, e))?.0,
            };
            let schema = Arc::new(schema);
            let all: Result<Vec<RecordBatch>, _> = if block.format == Format::Csv {
                let reader = arrow_csv::ReaderBuilder::new(Arc::clone(&schema))
                    .with_header(true)
                    .with_batch_size(BATCH)
                    .build(&bytes[..])
                    .map_err(|e| read_error(block, e))?;
                reader.collect()
            } else {
                let reader = arrow_json::ReaderBuilder::new(Arc::clone(&schema))
                    .with_batch_size(BATCH)
                    .build(&bytes[..])
                    .map_err(|e| read_error(block, e))?;
                reader.collect()
            };
            let all = concat(block, &all.map_err(|e| read_error(block, e))?)?;
            vec![all.slice(start.min(all.num_rows()), len.min(all.num_rows().saturating_sub(start)))]
        }
    };
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    counted(block, rows, len)?;
    for b in batches {
        if !emit(b) {
            break;
        }
    }
    Ok(())
}

fn counted(block: &Block, rows: usize, len: usize) -> Result<(), DataError> {
    if rows != len {
        return Err(read_error(block, format!("{rows} rows where the plan counted {len} (the file changed since the sweep began?)")));
    }
    Ok(())
}
