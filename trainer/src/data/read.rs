//! A rank's side: its share of a data set, read epoch after epoch in the
//! background (the same shares and orders as the Python client's).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::SchemaRef;
use futures_util::TryStreamExt;
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::arrow::ParquetRecordBatchStreamBuilder;

use super::plan::Stores;
use super::{Block, DataError, DataPlan, Format};
use crate::split::{permutation, rows_per_rank, share, Piece};

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
        Batches { rx, options, pending: Vec::new(), held: 0, done: false, failed }
    }
}

/// One epoch of a [`DataShard`], read ahead on a thread of its own.
pub struct Batches {
    rx: Receiver<Result<RecordBatch, DataError>>,
    options: BatchOptions,
    pending: Vec<RecordBatch>,
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
    /// The first `n` held rows as one batch; the rest stay.
    fn cut(&mut self, n: usize) -> Result<RecordBatch, DataError> {
        let schema: SchemaRef = self.pending[0].schema();
        let all = arrow_select::concat::concat_batches(&schema, &self.pending)
            .map_err(|e| DataError::Read { path: "<batch>".into(), message: e.to_string() })?;
        let n = n.min(all.num_rows());
        let rest = all.slice(n, all.num_rows() - n);
        self.pending.clear();
        self.held = rest.num_rows();
        if self.held > 0 {
            self.pending.push(rest);
        }
        Ok(all.slice(0, n))
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
                        self.pending.push(batch);
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
        let read = rt.block_on(async {
            if plan.shuffle {
                let whole = match cached.take() {
                    Some((b, batch)) if b == piece.block => batch,
                    _ => {
                        let batch = read_rows(&mut stores, block, 0, block.rows).await?;
                        let order = permutation(batch.num_rows(), plan.seed, epoch, piece.block as u64);
                        let idx = UInt32Array::from_iter_values(order.into_iter().map(|i| i as u32));
                        arrow_select::take::take_record_batch(&batch, &idx).map_err(|e| read_error(block, e))?
                    }
                };
                let out = whole.slice(piece.start as usize, (piece.end - piece.start) as usize);
                cached = Some((piece.block, whole));
                Ok(out)
            } else {
                read_rows(&mut stores, block, piece.start, piece.end).await
            }
        });
        let failed = read.is_err();
        if tx.send(read).is_err() || failed {
            return;
        }
    }
}

fn read_error(block: &Block, e: impl std::fmt::Display) -> DataError {
    DataError::Read { path: block.path.clone(), message: e.to_string() }
}

/// Rows `start..end` of a block, as one batch.
async fn read_rows(stores: &mut Stores, block: &Block, start: u64, end: u64) -> Result<RecordBatch, DataError> {
    let (start, len) = (start as usize, (end - start) as usize);
    let batch = match block.format {
        Format::Parquet => {
            let reader = stores.parquet(&block.path).await.map_err(|e| read_error(block, e))?;
            let builder = ParquetRecordBatchStreamBuilder::new(reader).await.map_err(|e| read_error(block, e))?;
            let schema = builder.schema().clone();
            let selection = RowSelection::from(vec![RowSelector::skip(start), RowSelector::select(len)]);
            let stream = builder
                .with_row_groups(vec![block.row_group.unwrap_or(0)])
                .with_row_selection(selection)
                .with_batch_size(len.max(1))
                .build()
                .map_err(|e| read_error(block, e))?;
            let batches: Vec<RecordBatch> = stream.try_collect().await.map_err(|e| read_error(block, e))?;
            arrow_select::concat::concat_batches(&schema, &batches).map_err(|e| read_error(block, e))?
        }
        Format::Csv | Format::Json => {
            let bytes = stores.bytes(&block.path).await.map_err(|e| read_error(block, e))?;
            let (schema, _) = super::plan::infer(&bytes, block.format).map_err(|e| read_error(block, e))?;
            let schema = Arc::new(schema);
            let batches: Result<Vec<RecordBatch>, _> = if block.format == Format::Csv {
                let reader = arrow_csv::ReaderBuilder::new(Arc::clone(&schema))
                    .with_header(true)
                    .with_batch_size(8192)
                    .build(&bytes[..])
                    .map_err(|e| read_error(block, e))?;
                reader.collect()
            } else {
                let reader = arrow_json::ReaderBuilder::new(Arc::clone(&schema))
                    .with_batch_size(8192)
                    .build(&bytes[..])
                    .map_err(|e| read_error(block, e))?;
                reader.collect()
            };
            let all = arrow_select::concat::concat_batches(&schema, &batches.map_err(|e| read_error(block, e))?)
                .map_err(|e| read_error(block, e))?;
            all.slice(start.min(all.num_rows()), len.min(all.num_rows().saturating_sub(start)))
        }
    };
    if batch.num_rows() != len {
        return Err(read_error(
            block,
            format!("{} rows where the plan counted {len} (the file changed since the sweep began?)", batch.num_rows()),
        ));
    }
    Ok(batch)
}
