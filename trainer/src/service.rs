//! The driver's gRPC report service: routes each worker's report to its
//! trial, after checking the trial's token and persisting the checkpoint.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::ack::Acknowledged;
use crate::aggregate::Aggregator;
use crate::backend::{Directive, Event, EventKind};
use crate::intake::{Intake, IntakeError, Shard};
use crate::proto::report_request::Checkpoint as Out;
use crate::proto::reporter_server::{Reporter, ReporterServer};
use crate::proto::{
    self, BookReply, BookRequest, GpuFiguresReply, GpuFiguresRequest, GrantedBundle, OutputChunk, OutputReceipt, RendezvousReply,
    RendezvousRequest, ReportReply, ReportRequest, ShardChunk, ShardReceipt, ShardRequest, TrainerRequest, TrainerUpdate,
};
use crate::shards::{read_chunks, ChunkWriter, Restore, RestoreError, ShardError, Shipping};
use crate::tls::ReportTls;

/// Largest report accepted, in bytes.
pub const MAX_REPORT_BYTES: usize = 1 << 20;

/// A registered trial: its secret, its report intake and its shipped shards.
struct Entry {
    token: String,
    intake: Arc<Intake>,
    shipping: Shipping,
    /// Where rank 0 waits for the others to form the process group, once posted.
    meeting: tokio::sync::watch::Sender<Option<String>>,
    /// The trial's events: where a `Book` goes.
    events: mpsc::UnboundedSender<Event>,
    /// Where its job's output goes (`JobOutput`), once a launcher whose runs
    /// send their output so takes it; unset, the call is refused.
    output: std::sync::OnceLock<mpsc::Sender<Vec<u8>>>,
}

/// How many `JobOutput` chunks (each at most [`MAX_REPORT_BYTES`]) wait for
/// the launcher before the job's side waits: the driver holds at most this many.
pub(crate) const OUTPUT_CHUNKS_BUFFERED: usize = 32;

#[derive(Default)]
struct Registry {
    trials: RwLock<HashMap<String, Arc<Entry>>>,
    /// The files ranks may fetch with `GetFile` (`[trainer] files`).
    files: RwLock<Vec<PathBuf>>,
    refusals: RefusalLog,
}

/// Refusals logged: at most [`REFUSALS_LOGGED`] lines per sender's address
/// in each [`REFUSAL_WINDOW`], the rest counted and summed up in one line
/// when the sender's next window opens; what the sender chose (trial id,
/// reason) escaped and cut short, so no message forges a log line.
#[derive(Default)]
struct RefusalLog {
    by_host: std::sync::Mutex<HashMap<String, RefusalWindow>>,
}

struct RefusalWindow {
    opened: std::time::Instant,
    logged: u32,
    suppressed: u64,
}

const REFUSALS_LOGGED: u32 = 5;
const REFUSAL_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);
/// Senders remembered at once; past it, windows already closed are
/// forgotten, and new senders share one.
const REFUSAL_HOSTS: usize = 4096;

/// `text` as a log shows what a sender chose: control characters escaped
/// (`\n`), at most `max` characters.
fn shown(text: &str, max: usize) -> String {
    let mut out = String::new();
    for c in text.chars().take(max) {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    if text.chars().nth(max).is_some() {
        out.push_str("...");
    }
    out
}

impl RefusalLog {
    /// Logs one refusal of `what` from `peer` (`host:port`), within the
    /// limits; `false` when it was only counted.
    fn refused(&self, what: &str, peer: &str, trial_id: &str, rank: u32, reason: &str) -> bool {
        let host = peer.rsplit_once(':').map_or(peer, |(h, _)| h);
        let now = std::time::Instant::now();
        let mut by_host = self.by_host.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut host = host;
        if by_host.len() >= REFUSAL_HOSTS && !by_host.contains_key(host) {
            by_host.retain(|_, w| now.duration_since(w.opened) < REFUSAL_WINDOW);
            if by_host.len() >= REFUSAL_HOSTS {
                // Past the bound, every new sender shares one budget.
                host = "(other senders)";
            }
        }
        let window = by_host.entry(host.to_string()).or_insert(RefusalWindow { opened: now, logged: 0, suppressed: 0 });
        if now.duration_since(window.opened) >= REFUSAL_WINDOW {
            if window.suppressed > 0 {
                tracing::warn!(peer = %host, count = window.suppressed, "{} more requests refused from this sender (not logged one by one)", window.suppressed);
            }
            *window = RefusalWindow { opened: now, logged: 0, suppressed: 0 };
        }
        if window.logged < REFUSALS_LOGGED {
            window.logged += 1;
            tracing::warn!(%peer, trial = %shown(trial_id, 80), rank, reason = %shown(reason, 400), "{what} refused");
            true
        } else {
            window.suppressed += 1;
            false
        }
    }
}

impl Registry {
    fn get(&self, trial_id: &str) -> Option<Arc<Entry>> {
        self.trials.read().ok().and_then(|m| m.get(trial_id).cloned())
    }
}

/// A trial registered with the report server, for as long as this guard
/// lives: dropping it unregisters the trial, and its workers' reports are
/// refused from then on.
#[derive(Debug)]
pub(crate) struct Registration {
    registry: std::sync::Weak<Registry>,
    trial_id: String,
    intake: Arc<Intake>,
}

impl Registration {
    /// The trial's step aggregator (told when a rank ends or fails).
    pub(crate) fn aggregator(&self) -> &Arc<Aggregator> {
        self.intake.aggregator()
    }

    /// The bytes the run's job sends (`JobOutput`), in order, bounded (the
    /// job's side waits while [`OUTPUT_CHUNKS_BUFFERED`] chunks are unread):
    /// taken by a launcher whose runs send their output so, once; for any
    /// other run, the call is refused.
    pub(crate) fn take_output(&mut self) -> Option<mpsc::Receiver<Vec<u8>>> {
        let entry = self.registry.upgrade()?.get(&self.trial_id)?;
        let (tx, rx) = mpsc::channel(OUTPUT_CHUNKS_BUFFERED);
        entry.output.set(tx).ok().map(|()| rx)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            if let Ok(mut map) = registry.trials.write() {
                map.remove(&self.trial_id);
            }
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registry")
    }
}

/// The report service, listening on loopback; one per driver, shared by all
/// process trials. Dropping it stops the server.
pub struct ReportServer {
    addr: SocketAddr,
    registry: Arc<Registry>,
    shutdown: Option<oneshot::Sender<()>>,
    /// The certificate authority ranks trust (PEM), when the channel is TLS.
    ca_pem: Option<String>,
    /// This node's per-trial GPU figures, added to every run's reports.
    gpu: Arc<crate::gpu_usage::GpuUsage>,
}

impl std::fmt::Debug for ReportServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportServer").field("addr", &self.addr).field("tls", &self.ca_pem.is_some()).finish()
    }
}

impl ReportServer {
    /// Binds `bind` (use port 0 for a free port) and serves plaintext
    /// HTTP/2 until dropped: for ranks on this machine.
    pub async fn start(bind: SocketAddr) -> std::io::Result<Self> {
        Self::start_with(bind, None).await
    }

    /// [`ReportServer::start`], over TLS with a certificate made for this
    /// server alone ([`ReportTls`]): for ranks on other machines.
    pub async fn start_encrypted(bind: SocketAddr) -> std::io::Result<Self> {
        let tls = ReportTls::generate().map_err(|e| std::io::Error::other(format!("cannot make the report channel's certificate: {e}")))?;
        Self::start_with(bind, Some(tls)).await
    }

    async fn start_with(bind: SocketAddr, tls: Option<ReportTls>) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let registry = Arc::new(Registry::default());
        let gpu = Arc::new(crate::gpu_usage::GpuUsage::default());
        let service = ReporterServer::new(Service { registry: Arc::clone(&registry), gpu: Arc::clone(&gpu) })
            .max_decoding_message_size(MAX_REPORT_BYTES);
        let mut builder = tonic::transport::Server::builder()
            // Shipped checkpoint shards stream megabytes: windows wider than HTTP/2's 64 KiB default.
            .initial_stream_window_size(Some(4 << 20))
            .initial_connection_window_size(Some(16 << 20));
        if let Some(tls) = &tls {
            builder = builder.tls_config(tls.server_config()).map_err(std::io::Error::other)?;
        }
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            // Reports are small request/response pairs: no Nagle delay on them.
            let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |conn| {
                conn.inspect(|c| {
                    let _ = c.set_nodelay(true);
                })
            });
            let result = builder
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "report server failed");
            }
        });
        Ok(Self { addr, registry, shutdown: Some(tx), ca_pem: tls.map(|t| t.ca_pem().to_string()), gpu })
    }

    /// The certificate authority ranks must trust (the plan's `channel.tls_ca`), when
    /// the channel is TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The URL scheme ranks dial: `https` over TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The files a registered rank may fetch with `GetFile`, named as given.
    pub fn serve_files(&self, files: &[PathBuf]) {
        *self.registry.files.write().unwrap_or_else(std::sync::PoisonError::into_inner) = files.to_vec();
    }

    /// Serves `files` too (a trainer's inside a trial), beside those served.
    pub fn add_files(&self, files: &[PathBuf]) {
        let mut served = self.registry.files.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        for f in files {
            if !served.contains(f) {
                served.push(f.clone());
            }
        }
    }

    /// The per-trial GPU figures of the runs on this node, which the
    /// engine fills in (what each run holds) and every report carries.
    pub fn gpu_usage(&self) -> &Arc<crate::gpu_usage::GpuUsage> {
        &self.gpu
    }

    /// The address workers report to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL workers get in `NESTOR_ADDR`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme(), self.addr)
    }

    /// Registers a run of `spec.trial_id`: its reports are taken until the
    /// returned guard is dropped.
    pub(crate) fn register(
        &self,
        spec: &crate::LaunchSpec,
        token: String,
        roots: Vec<PathBuf>,
        events: mpsc::UnboundedSender<Event>,
    ) -> Registration {
        let aggregator = Arc::new(
            Aggregator::new(&spec.trial_id, spec.world_size(), spec.start_iteration, events.clone()).with_gpu(Arc::clone(&self.gpu)),
        );
        let intake = Arc::new(Intake::new(spec.storage.clone(), roots, aggregator));
        let shipping = Shipping::new(&spec.trial_dir, Restore::of(spec), spec.world_size());
        let entry = Entry {
            token,
            intake: Arc::clone(&intake),
            shipping,
            meeting: tokio::sync::watch::Sender::new(None),
            events,
            output: std::sync::OnceLock::new(),
        };
        if let Ok(mut map) = self.registry.trials.write() {
            map.insert(spec.trial_id.clone(), Arc::new(entry));
        }
        Registration { registry: Arc::downgrade(&self.registry), trial_id: spec.trial_id.clone(), intake }
    }
}

impl Drop for ReportServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

struct Service {
    registry: Arc<Registry>,
    /// The per-trial GPU figures, which the samplers of a cluster's nodes add to.
    gpu: Arc<crate::gpu_usage::GpuUsage>,
}

/// The registered trial a message names, once its version and token check
/// out; a refusal is logged with the sender.
fn authenticate(registry: &Registry, version: u32, trial_id: &str, token: &str, rank: u32, peer: &str) -> Result<Arc<Entry>, Status> {
    let refuse = |status: Status| {
        let _ = registry.refusals.refused("report", peer, trial_id, rank, status.message());
        status
    };
    if version != 1 {
        return Err(refuse(Status::invalid_argument(format!("unsupported protocol version {version} (this driver speaks 1)"))));
    }
    // An unknown trial and a wrong token are one answer: a sender learns
    // nothing of which trials run.
    let entry = registry.get(trial_id).filter(|e| crate::token::secrets_equal(&e.token, token));
    let Some(entry) = entry else {
        return Err(refuse(Status::unauthenticated("unknown trial or wrong token (the token is the run's bearer secret)")));
    };
    if rank >= entry.shipping.world {
        return Err(refuse(Status::invalid_argument(format!("rank {rank} out of range (world size {})", entry.shipping.world))));
    }
    Ok(entry)
}

/// The scaling a `Book` asks for, checked: the error names its field.
fn booked_scaling(r: &BookRequest) -> Result<crate::ScalingConfig, crate::ScalingError> {
    let map = |m: &HashMap<String, f64>| m.iter().map(|(k, v)| (k.clone(), *v)).collect::<crate::Resources>();
    let strategy = match r.placement_strategy.as_str() {
        "" | "PACK" => crate::PlacementStrategy::Pack,
        "STRICT_PACK" => crate::PlacementStrategy::StrictPack,
        "SPREAD" => crate::PlacementStrategy::Spread,
        "STRICT_SPREAD" => crate::PlacementStrategy::StrictSpread,
        other => {
            return Err(crate::ScalingError {
                key: "placement_strategy".into(),
                message: format!("`{other}` is not one of PACK, STRICT_PACK, SPREAD, STRICT_SPREAD"),
            })
        }
    };
    let scaling = crate::ScalingConfig {
        num_workers: r.num_workers,
        use_gpu: r.use_gpu,
        resources_per_worker: (!r.resources_per_worker.is_empty()).then(|| map(&r.resources_per_worker)),
        placement_strategy: strategy,
        trainer_resources: map(&r.trainer_resources),
    };
    scaling.validate()?;
    Ok(scaling)
}

/// Checks one report, persists its checkpoint shard, hands it to its trial's
/// aggregator and waits for the driver's decision. A refusal is logged with
/// the sender and changes nothing. Also returns what watches the run's
/// acknowledgements.
async fn handle(registry: &Registry, r: ReportRequest, peer: &str) -> Result<(ReportReply, Acknowledged), Status> {
    let refuse = |status: Status| {
        let _ = registry.refusals.refused("report", peer, &r.trial_id, r.rank, status.message());
        Err(status)
    };
    let entry = authenticate(registry, r.version, &r.trial_id, &r.token, r.rank, peer)?;
    let shipped;
    let shard = match &r.checkpoint {
        None if r.checkpoint_staged => return refuse(Status::invalid_argument("checkpoint_staged names no checkpoint_dir")),
        None => None,
        Some(Out::CheckpointDir(d)) if !r.checkpoint_staged => Some(Shard::Dir(Path::new(d))),
        Some(Out::CheckpointDir(d) | Out::CheckpointStagedDir(d)) => {
            let dir = Path::new(d);
            if let Err(why) = entry.shipping.check_staged(dir, r.rank) {
                return refuse(Status::invalid_argument(why));
            }
            Some(Shard::Staged(dir))
        }
        Some(_) if r.checkpoint_staged => {
            return refuse(Status::invalid_argument("checkpoint_staged goes with checkpoint_dir, not with another checkpoint"))
        }
        Some(Out::CheckpointUpload(upload)) => match entry.shipping.claim(upload, r.rank) {
            Ok(dir) => {
                shipped = dir;
                Some(Shard::Staged(&shipped))
            }
            Err(why) => return refuse(Status::invalid_argument(why)),
        },
        Some(Out::CheckpointUploaded(uri)) => Some(Shard::Uploaded(uri)),
    };
    let extra = match r.extra.as_str() {
        "" => None,
        text => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v @ serde_json::Value::Object(_)) => Some(v),
            Ok(_) => return refuse(Status::invalid_argument("extra must be a JSON object (name -> value)")),
            Err(e) => return refuse(Status::invalid_argument(format!("extra is not JSON: {e}"))),
        },
    };
    if let Some(name) = extra.as_ref().and_then(|e| e.as_object()).and_then(|m| m.keys().find(|k| r.metrics.contains_key(*k))) {
        return refuse(Status::invalid_argument(format!("{name:?} is both a metric and an extra value")));
    }
    let submitted = entry.intake.submit(r.rank, r.metrics.clone().into_iter().collect(), extra, shard).await;
    if let Some(Shard::Staged(staged)) = shard.filter(|s| matches!(s, Shard::Staged(d) if d.exists())) {
        // Refused, or persisted by a copy: the staged copy has served.
        let _ = tokio::fs::remove_dir_all(staged).await;
    }
    let acks = entry.intake.aggregator().acknowledged();
    drop(entry);
    let (iteration, rx) = match submitted {
        Ok(ok) => ok,
        Err(IntakeError::Checkpoint(e)) if !e.is_refusal() => return refuse(Status::unavailable(e.to_string())),
        Err(e) => return refuse(Status::invalid_argument(e.to_string())),
    };
    let directive = match rx.await.unwrap_or(Directive::Stop) {
        Directive::Continue => proto::Directive::Continue,
        Directive::Stop => proto::Directive::Stop,
    };
    let reply = ReportReply { directive: directive as i32, training_iteration: iteration, acknowledged_iteration: acks.through() };
    Ok((reply, acks))
}

/// A report stream's state between requests: the stream, and the run and
/// step its last report was.
struct Open {
    inbound: tonic::Streaming<ReportRequest>,
    last: Option<(Acknowledged, u64)>,
}

type ReplyStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<ReportReply, Status>> + Send>>;
/// Who sent a request, for the log of a refusal.
fn peer<T>(request: &Request<T>) -> String {
    request.remote_addr().map_or_else(|| "unknown peer".to_string(), |a| a.to_string())
}

type UpdateStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<TrainerUpdate, Status>> + Send>>;
type ChunkStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<ShardChunk, Status>> + Send>>;

/// Receives one shipped shard into a staging directory of its trial's.
async fn put_shard(registry: &Registry, mut inbound: tonic::Streaming<ShardChunk>, peer: &str) -> Result<ShardReceipt, Status> {
    let Some(first) = inbound.message().await? else {
        return Err(Status::invalid_argument("a shard upload with no chunk"));
    };
    let entry = authenticate(registry, first.version, &first.trial_id, &first.token, first.rank, peer)?;
    let (trial_id, rank) = (first.trial_id.clone(), first.rank);
    let (name, dir) = entry.shipping.stage(rank);
    // Files are written on a blocking thread, chunks handed over as they come.
    let (tx, mut rx) = mpsc::channel::<ShardChunk>(4);
    let at = dir.clone();
    let writer = tokio::task::spawn_blocking(move || {
        let mut w = ChunkWriter::new(&at).map_err(|e| ShardError::Io(format!("{}: {e}", at.display())))?;
        while let Some(chunk) = rx.blocking_recv() {
            w.write(&chunk)?;
        }
        Ok::<_, ShardError>((w.files, w.bytes))
    });
    let mut received: Result<(), Status> = Ok(());
    let mut next = Some(first);
    while let Some(chunk) = next.take() {
        if tx.send(chunk).await.is_err() {
            break; // the writer failed: its error says why
        }
        match inbound.message().await {
            Ok(c) => next = c,
            Err(status) => received = Err(status),
        }
    }
    drop(tx);
    let written = writer.await.map_err(|e| Status::internal(format!("shard writer: {e}")))?;
    let outcome = match (received, written) {
        (_, Err(ShardError::Refused(why))) => {
            let _ = registry.refusals.refused("shard upload", peer, &trial_id, rank, &why);
            Err(Status::invalid_argument(why))
        }
        (_, Err(ShardError::Io(why))) => Err(Status::unavailable(format!("cannot stage the shard: {why}"))),
        (Err(status), _) => Err(status),
        (Ok(()), Ok((files, bytes))) => Ok(ShardReceipt { upload: name.clone(), files, bytes }),
    };
    match outcome {
        Ok(receipt) => {
            entry.shipping.staged(name, rank, dir);
            Ok(receipt)
        }
        Err(status) => {
            let _ = tokio::fs::remove_dir_all(&dir).await;
            Err(status)
        }
    }
}

#[tonic::async_trait]
impl Reporter for Service {
    async fn report(&self, request: Request<ReportRequest>) -> Result<Response<ReportReply>, Status> {
        let peer = peer(&request);
        handle(&self.registry, request.into_inner(), &peer).await.map(|(reply, _)| Response::new(reply))
    }

    type SessionStream = ReplyStream;
    type GetShardStream = ChunkStream;
    type GetFileStream = ChunkStream;
    type RunTrainerStream = UpdateStream;

    async fn put_shard(&self, request: Request<tonic::Streaming<ShardChunk>>) -> Result<Response<ShardReceipt>, Status> {
        let peer = peer(&request);
        put_shard(&self.registry, request.into_inner(), &peer).await.map(Response::new)
    }

    async fn job_output(&self, request: Request<tonic::Streaming<OutputChunk>>) -> Result<Response<OutputReceipt>, Status> {
        let peer = peer(&request);
        let mut inbound = request.into_inner();
        let mut bytes = 0u64;
        let mut entry: Option<Arc<Entry>> = None;
        while let Some(chunk) = inbound.message().await? {
            let sink = match &entry {
                Some(e) => e,
                None => entry.insert(authenticate(&self.registry, chunk.version, &chunk.trial_id, &chunk.token, 0, &peer)?),
            };
            let len = chunk.data.len() as u64;
            let sent = match sink.output.get() {
                Some(output) => output.send(chunk.data).await.map_err(drop),
                None => Err(()),
            };
            if sent.is_err() {
                return Err(Status::failed_precondition(format!("trial `{}` runs no job whose output comes here", chunk.trial_id)));
            }
            bytes += len;
        }
        Ok(Response::new(OutputReceipt { bytes }))
    }

    async fn rendezvous(&self, request: Request<RendezvousRequest>) -> Result<Response<RendezvousReply>, Status> {
        let peer = peer(&request);
        let r = request.into_inner();
        let entry = authenticate(&self.registry, r.version, &r.trial_id, &r.token, r.rank, &peer)?;
        if r.rank == 0 {
            if r.address.is_empty() {
                return Err(Status::invalid_argument("rank 0 posts the address its store listens on; it was empty"));
            }
            tracing::info!(trial = %r.trial_id, address = %r.address, "rank 0 posted where the ranks meet");
            entry.meeting.send_replace(Some(r.address.clone()));
            return Ok(Response::new(RendezvousReply { address: r.address }));
        }
        if !r.address.is_empty() {
            return Err(Status::invalid_argument(format!("rank {} posted an address; only rank 0 posts one", r.rank)));
        }
        let mut posted = entry.meeting.subscribe();
        drop(entry);
        let address = posted.wait_for(Option::is_some).await.map_err(|_| Status::unavailable("the run ended"))?.clone().unwrap_or_default();
        Ok(Response::new(RendezvousReply { address }))
    }

    async fn gpu_figures(&self, request: Request<GpuFiguresRequest>) -> Result<Response<GpuFiguresReply>, Status> {
        let peer = peer(&request);
        let r = request.into_inner();
        let entry = authenticate(&self.registry, r.version, &r.trial_id, &r.token, r.rank, &peer)?;
        // A run has no more nodes than ranks: a node number past them would be a figure of no node.
        if r.node >= entry.shipping.world {
            return Err(Status::invalid_argument(format!("node {} out of range (world size {})", r.node, entry.shipping.world)));
        }
        if !r.note.is_empty() {
            // One line in the driver's log, whatever the sender wrote: escaped and cut short.
            let note: String = r.note.chars().take(500).flat_map(char::escape_debug).collect();
            tracing::warn!(trial = %r.trial_id, node = r.node, "{note}");
        } else if !r.util_percent.is_finite() || !(0.0..=100.0).contains(&r.util_percent) {
            return Err(Status::invalid_argument(format!("util_percent {} is not a percentage", r.util_percent)));
        } else if r.gpus == 0 {
            return Err(Status::invalid_argument("gpus is 0: figures cover at least one GPU"));
        } else {
            self.gpu.record_node(&r.trial_id, r.node, r.gpus, r.util_percent, r.memory_bytes);
        }
        Ok(Response::new(GpuFiguresReply {}))
    }

    async fn book(&self, request: Request<BookRequest>) -> Result<Response<BookReply>, Status> {
        let peer = peer(&request);
        let r = request.into_inner();
        let entry = authenticate(&self.registry, r.version, &r.trial_id, &r.token, r.rank, &peer)?;
        let scaling = booked_scaling(&r).map_err(|e| Status::invalid_argument(format!("ScalingConfig.{e}")))?;
        let (tx, rx) = oneshot::channel();
        let event =
            Event { trial_id: r.trial_id.clone(), kind: EventKind::Book { request: crate::Request::from_scaling(&scaling), reply: tx } };
        if entry.events.send(event).is_err() {
            return Err(Status::unavailable("the driver is stopping"));
        }
        drop(entry);
        match rx.await {
            Ok(Ok(workers)) => Ok(Response::new(BookReply {
                workers: workers
                    .into_iter()
                    .map(|w| GrantedBundle {
                        cpus: w.cpus,
                        gpus: w.gpus,
                        gpu_share: w.gpu_share,
                        memory_bytes: w.memory_bytes,
                        custom: w.custom.into_iter().collect(),
                    })
                    .collect(),
            })),
            Ok(Err(why)) => Err(Status::failed_precondition(why)),
            Err(_) => Err(Status::unavailable("the trial is no longer running")),
        }
    }

    async fn run_trainer(&self, request: Request<TrainerRequest>) -> Result<Response<UpdateStream>, Status> {
        let peer = peer(&request);
        let r = request.into_inner();
        let entry = authenticate(&self.registry, r.version, &r.trial_id, &r.token, r.rank, &peer)?;
        let events = entry.events.clone();
        drop(entry);
        let run: crate::inner::TrainerRun =
            serde_json::from_str(&r.run).map_err(|e| Status::invalid_argument(format!("the trainer's run: {e}")))?;
        // Off the loop: the program looked for, the storage listed.
        let run = crate::inner::prepare(run).await.map_err(|e| Status::invalid_argument(format!("the trainer's run: {e}")))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let event = Event { trial_id: r.trial_id, kind: EventKind::RunTrainer { run: Box::new(run), updates: tx } };
        if events.send(event).is_err() {
            return Err(Status::unavailable("the driver is stopping"));
        }
        // Dropping the stream (the trial's process gone) closes `rx`: the loop stops the run.
        let updates = tokio_stream::StreamExt::map(tokio_stream::wrappers::UnboundedReceiverStream::new(rx), |u| {
            serde_json::to_string(&u).map(|update| TrainerUpdate { update }).map_err(|e| Status::internal(e.to_string()))
        });
        Ok(Response::new(Box::pin(updates)))
    }

    async fn get_shard(&self, request: Request<ShardRequest>) -> Result<Response<ChunkStream>, Status> {
        let peer = peer(&request);
        let r = request.into_inner();
        let entry = authenticate(&self.registry, r.version, &r.trial_id, &r.token, r.rank, &peer)?;
        let shipping = &entry.shipping;
        let shard = if r.whole { shipping.restore_checkpoint().await } else { shipping.restore_shard(r.rank).await };
        // None there is NotFound (the rank starts afresh); a download that failed is not.
        let shard = shard.map_err(|e| match e {
            RestoreError::Missing(why) => Status::not_found(why),
            RestoreError::Download(why) => Status::unavailable(why),
        })?;
        let (tx, rx) = mpsc::channel::<Result<ShardChunk, Status>>(4);
        tokio::task::spawn_blocking(move || {
            let sent = read_chunks(&shard, ShardChunk::default(), |c| tx.blocking_send(Ok(c)).is_ok());
            if let Err(e) = sent {
                // The stream ends in an error, never short: the rank must not resume from part of a shard.
                let _ = tx.blocking_send(Err(Status::unavailable(format!("reading {}: {e}", shard.display()))));
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn get_file(&self, request: Request<ShardRequest>) -> Result<Response<ChunkStream>, Status> {
        let peer = peer(&request);
        let r = request.into_inner();
        authenticate(&self.registry, r.version, &r.trial_id, &r.token, r.rank, &peer)?;
        let path = PathBuf::from(&r.path);
        let listed = self.registry.files.read().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&path);
        if !listed {
            let _ = self.registry.refusals.refused(
                "file request",
                &peer,
                &r.trial_id,
                r.rank,
                &format!("{} is not one of [trainer] files", r.path),
            );
            return Err(Status::not_found(format!("{} is not one of [trainer] files", r.path)));
        }
        let (tx, rx) = mpsc::channel::<Result<ShardChunk, Status>>(4);
        tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let name = r.path.clone();
            let sent = std::fs::File::open(&path).and_then(|mut f| {
                let mut buf = vec![0u8; crate::shards::CHUNK_BYTES];
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        return Ok(());
                    }
                    let chunk = ShardChunk { path: name.clone(), data: buf[..n].to_vec(), ..ShardChunk::default() };
                    if tx.blocking_send(Ok(chunk)).is_err() {
                        return Ok(());
                    }
                }
            });
            if let Err(e) = sent {
                // Never short: the rank must not run from part of a file.
                let _ = tx.blocking_send(Err(Status::unavailable(format!("reading {}: {e}", path.display()))));
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn session(&self, request: Request<tonic::Streaming<ReportRequest>>) -> Result<Response<ReplyStream>, Status> {
        let peer = peer(&request);
        let inbound = request.into_inner();
        let registry = Arc::clone(&self.registry);
        // One reply per request, in order, produced as the reply stream is polled;
        // after a refusal (or a broken stream) the stream ends. Once the worker
        // closes its side, it ends when every report on it is durable.
        let replies = futures_util::stream::unfold(Some(Open { inbound, last: None }), move |open| {
            let (registry, peer) = (Arc::clone(&registry), peer.clone());
            async move {
                let Open { mut inbound, last } = open?;
                let request = match inbound.message().await {
                    Ok(Some(r)) => r,
                    Ok(None) => {
                        let (mut acks, iteration) = last?;
                        return match acks.wait_for(iteration).await {
                            Ok(_) => None,
                            Err(e) => Some((Err(Status::unavailable(e.to_string())), None)),
                        };
                    }
                    Err(status) => return Some((Err(status), None)),
                };
                match handle(&registry, request, &peer).await {
                    Ok((reply, acks)) => {
                        let last = Some((acks, reply.training_iteration));
                        Some((Ok(reply), Some(Open { inbound, last })))
                    }
                    Err(status) => Some((Err(status), None)),
                }
            }
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::reporter_client::ReporterClient;

    type Setup = (ReportServer, mpsc::UnboundedReceiver<Event>, ReporterClient<tonic::transport::Channel>, tempfile::TempDir, Registration);

    async fn setup() -> Setup {
        let server = ReportServer::start(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::LaunchSpec::new("t1", serde_json::json!({}), dir.path());
        let registration = server.register(&spec, "secret".into(), spec.roots(None), tx);
        let client = ReporterClient::connect(server.url()).await.unwrap();
        (server, rx, client, dir, registration)
    }

    fn request(token: &str, rank: u32) -> ReportRequest {
        ReportRequest {
            version: 1,
            trial_id: "t1".into(),
            token: token.into(),
            rank,
            metrics: [("loss".to_string(), 0.5)].into_iter().collect(),
            checkpoint: None,
            checkpoint_staged: false,
            extra: String::new(),
        }
    }

    /// Ships the files of `dir` as rank `rank`'s shard (token `token`).
    async fn put(
        client: &mut ReporterClient<tonic::transport::Channel>,
        dir: &std::path::Path,
        token: &str,
        rank: u32,
    ) -> Result<ShardReceipt, Status> {
        let head = ShardChunk { version: 1, trial_id: "t1".into(), token: token.into(), rank, ..ShardChunk::default() };
        let mut chunks = Vec::new();
        read_chunks(dir, head, |c| {
            chunks.push(c);
            true
        })
        .unwrap();
        client.put_shard(tokio_stream::iter(chunks)).await.map(Response::into_inner)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_booking_reaches_the_trials_events_checked_and_is_answered_with_the_grant() {
        let (_server, mut rx, mut c, _dir, _reg) = setup().await;
        let ask = |strategy: &str, per_worker: &[(&str, f64)]| BookRequest {
            version: 1,
            trial_id: "t1".into(),
            token: "secret".into(),
            rank: 0,
            num_workers: 2,
            use_gpu: false,
            resources_per_worker: per_worker.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            trainer_resources: HashMap::new(),
            placement_strategy: strategy.into(),
        };
        // Bad settings are refused by name before the driver hears of them.
        let bad = c.book(ask("SIDEWAYS", &[])).await.unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert!(bad.message().contains("ScalingConfig.placement_strategy"), "{}", bad.message());
        let bad = c.book(ask("PACK", &[("GPU", 1.0)])).await.unwrap_err();
        assert!(bad.message().contains("ScalingConfig.use_gpu"), "{}", bad.message());
        assert_eq!(c.book(BookRequest { token: "x".into(), ..ask("", &[]) }).await.unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(rx.try_recv().is_err(), "a refused booking reached the driver");
        // A good one: the driver sees the trainer's whole request and answers with the bundles.
        let waiting = tokio::spawn(async move { c.book(ask("SPREAD", &[("CPU", 0.5)])).await });
        let Some(Event { trial_id, kind: EventKind::Book { request, reply } }) = rx.recv().await else { panic!("a booking") };
        assert_eq!(trial_id, "t1");
        assert_eq!(request.workers.len(), 2);
        assert_eq!(request.workers[0].get("CPU"), Some(&0.5));
        assert_eq!(request.strategy, crate::PlacementStrategy::Spread);
        reply.send(Ok(vec![crate::WorkerBundle::cpus(0.5); 2])).unwrap();
        let granted = waiting.await.unwrap().unwrap().into_inner();
        assert_eq!(granted.workers.len(), 2);
        assert_eq!(granted.workers[1].cpus, 0.5);
    }

    /// A node's GPU sampler's figures are checked as a report is (the run's
    /// token, the sender's rank, a percentage) and ride on the trial's next
    /// result; a note is taken, and counts nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_nodes_gpu_figures_are_checked_and_ride_on_the_trials_next_result() {
        let (_server, mut rx, mut c, _dir, _reg) = setup().await;
        let figures = |token: &str, rank: u32, util: f64, gpus: u32| GpuFiguresRequest {
            version: 1,
            trial_id: "t1".into(),
            token: token.into(),
            rank,
            node: 0,
            gpus,
            util_percent: util,
            memory_bytes: 3 << 30,
            note: String::new(),
        };
        for (bad, code) in [
            (figures("wrong", 0, 50.0, 1), tonic::Code::Unauthenticated),
            (figures("secret", 9, 50.0, 1), tonic::Code::InvalidArgument),
            (figures("secret", 0, 150.0, 1), tonic::Code::InvalidArgument),
            (figures("secret", 0, f64::NAN, 1), tonic::Code::InvalidArgument),
            (figures("secret", 0, 50.0, 0), tonic::Code::InvalidArgument),
            (GpuFiguresRequest { node: 7, ..figures("secret", 0, 50.0, 1) }, tonic::Code::InvalidArgument),
        ] {
            assert_eq!(c.gpu_figures(bad).await.unwrap_err().code(), code);
        }
        let note = GpuFiguresRequest { note: "no NVML here\nerror: forged line".repeat(100), ..figures("secret", 0, 0.0, 0) };
        c.gpu_figures(note).await.unwrap();
        // One report, answered; what reached the driver with it.
        let step = |c: &ReporterClient<tonic::transport::Channel>| {
            let mut c = c.clone();
            tokio::spawn(async move { c.report(request("secret", 0)).await })
        };
        let sent = step(&c);
        let ev = rx.recv().await.unwrap();
        let crate::EventKind::Report { report, reply } = ev.kind else { panic!("expected a report") };
        drop(reply.send(Directive::Continue));
        sent.await.unwrap().unwrap();
        assert!(!report.metrics.keys().any(|k| k.starts_with("gpu_")), "nothing counted yet: {:?}", report.metrics);
        c.gpu_figures(figures("secret", 0, 50.0, 2)).await.unwrap();
        let sent = step(&c);
        let ev = rx.recv().await.unwrap();
        let crate::EventKind::Report { report, reply } = ev.kind else { panic!("expected a report") };
        drop(reply.send(Directive::Continue));
        sent.await.unwrap().unwrap();
        assert_eq!(report.metrics.get("gpu_util_percent"), Some(&50.0), "{:?}", report.metrics);
        assert_eq!(report.metrics.get("gpu_memory_bytes"), Some(&f64::from(3u32 << 30)));
    }

    /// Rank 0 posts where its store listens; the others, asking before or
    /// after, are told; only rank 0 posts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ranks_meet_at_the_address_rank_0_posts() {
        let server = ReportServer::start(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let (tx, _rx) = mpsc::unbounded_channel();
        let dir = tempfile::tempdir().unwrap();
        let mut spec = crate::LaunchSpec::new("t1", serde_json::json!({}), dir.path());
        spec.workers = vec![crate::WorkerBundle::cpus(1.0); 3];
        let _registration = server.register(&spec, "secret".into(), Vec::new(), tx);
        let client = ReporterClient::connect(server.url()).await.unwrap();
        let ask = |rank: u32, address: &str| RendezvousRequest {
            version: 1,
            trial_id: "t1".into(),
            token: "secret".into(),
            rank,
            address: address.into(),
        };
        let mut early = client.clone();
        let waiting = tokio::spawn(async move { early.rendezvous(ask(1, "")).await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "rank 1 waits for rank 0");
        let mut c = client.clone();
        assert_eq!(c.rendezvous(ask(2, "10.0.0.9:1")).await.unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(c.rendezvous(ask(0, "")).await.unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(
            c.rendezvous(RendezvousRequest { token: "x".into(), ..ask(1, "") }).await.unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        c.rendezvous(ask(0, "10.0.0.1:4242")).await.unwrap();
        assert_eq!(waiting.await.unwrap().unwrap().into_inner().address, "10.0.0.1:4242");
        assert_eq!(c.rendezvous(ask(2, "")).await.unwrap().into_inner().address, "10.0.0.1:4242");
    }

    /// A rank that staged its own copy of a checkpoint below the trial's
    /// staging directory has it moved into place (the same inode: no byte
    /// read again); a staged path elsewhere, or another rank's, is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_checkpoint_a_rank_staged_itself_is_moved_into_place() {
        use std::os::unix::fs::MetadataExt;
        let server = ReportServer::start(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::LaunchSpec::new("t1", serde_json::json!({}), dir.path().join("trial"));
        let registration = server.register(&spec, "secret".into(), Vec::new(), tx);
        let mut client = ReporterClient::connect(server.url()).await.unwrap();
        let incoming = spec.trial_dir.join(".incoming");
        let stage = |name: &str| {
            let d = incoming.join(name);
            std::fs::create_dir_all(d.join("opt")).unwrap();
            std::fs::write(d.join("model.bin"), b"weights").unwrap();
            std::fs::write(d.join("opt/state.json"), b"{}").unwrap();
            d
        };
        let staged = |d: &std::path::Path, rank: u32| ReportRequest {
            checkpoint: Some(Out::CheckpointStagedDir(d.display().to_string())),
            ..request("secret", rank)
        };
        let elsewhere = tempfile::tempdir().unwrap();
        let status = client.report(staged(elsewhere.path(), 0)).await.unwrap_err();
        assert!(status.message().contains("a staged checkpoint must be"), "{}", status.message());
        // A sender from before the oneof names a staged copy as a directory and a flag: the same checks.
        let legacy = ReportRequest {
            checkpoint: Some(Out::CheckpointDir(elsewhere.path().display().to_string())),
            checkpoint_staged: true,
            ..request("secret", 0)
        };
        let status = client.report(legacy).await.unwrap_err();
        assert!(status.message().contains("a staged checkpoint must be"), "{}", status.message());
        let others = stage("rank-1-abc");
        let status = client.report(staged(&others, 0)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let uploaded =
            ReportRequest { checkpoint: Some(Out::CheckpointUploaded("s3://bucket/x/checkpoint_000001".into())), ..request("secret", 0) };
        let status = client.report(uploaded).await.unwrap_err();
        assert!(status.message().contains("is not this report's"), "{}", status.message());
        let list = ReportRequest { extra: "[1]".into(), ..request("secret", 0) };
        assert!(client.report(list).await.unwrap_err().message().contains("extra must be a JSON object"));
        let clash = ReportRequest { extra: r#"{"loss": "low"}"#.into(), ..request("secret", 0) };
        assert!(client.report(clash).await.unwrap_err().message().contains("is both a metric and an extra value"));
        let empty = ReportRequest { checkpoint_staged: true, ..request("secret", 0) };
        assert_eq!(client.report(empty).await.unwrap_err().code(), tonic::Code::InvalidArgument);

        let mine = stage("rank-0-def");
        let inode = std::fs::metadata(mine.join("model.bin")).unwrap().ino();
        let mut c0 = client.clone();
        let q = staged(&mine, 0);
        let rank0 = tokio::spawn(async move { c0.report(q).await });
        let ev = rx.recv().await.unwrap();
        let crate::EventKind::Report { report, reply } = ev.kind else { panic!("expected a report") };
        let ckpt = report.checkpoint.unwrap();
        let shard = std::path::Path::new(&ckpt.uri).join("rank-0");
        assert_eq!(std::fs::read(shard.join("model.bin")).unwrap(), b"weights");
        assert_eq!(std::fs::read(shard.join("opt/state.json")).unwrap(), b"{}");
        assert_eq!(std::fs::metadata(shard.join("model.bin")).unwrap().ino(), inode, "moved, not copied");
        assert!(!mine.exists());
        reply.send(Directive::Continue).durable();
        rank0.await.unwrap().unwrap();
        // What no report claimed goes with the run.
        drop(registration);
        assert!(!incoming.exists(), "the run's end removes what is staged");
    }

    /// A shard shipped through the channel is staged, persisted once its
    /// report claims it, and its staging copy removed; bad uploads and
    /// claims are refused; a restarted run's ranks fetch their shards.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shards_ship_both_ways_through_the_channel() {
        let server = ReportServer::start(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let dir = tempfile::tempdir().unwrap();
        let mut spec = crate::LaunchSpec::new("t1", serde_json::json!({}), dir.path().join("trial"));
        spec.workers = vec![crate::WorkerBundle::cpus(1.0); 2];
        let registration = server.register(&spec, "secret".into(), Vec::new(), tx.clone());
        let mut client = ReporterClient::connect(server.url()).await.unwrap();
        let shard = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(shard.path().join("opt")).unwrap();
        let weights: Vec<u8> = (0..700_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(shard.path().join("model.bin"), &weights).unwrap();
        std::fs::write(shard.path().join("opt/state.json"), b"{}").unwrap();

        assert_eq!(put(&mut client, shard.path(), "wrong", 0).await.unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(put(&mut client, shard.path(), "secret", 2).await.unwrap_err().code(), tonic::Code::InvalidArgument);
        let escaping =
            ShardChunk { version: 1, trial_id: "t1".into(), token: "secret".into(), path: "../x".into(), ..ShardChunk::default() };
        let status = client.put_shard(tokio_stream::iter(vec![escaping])).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("not a relative path"), "{}", status.message());
        let incoming = spec.trial_dir.join(".incoming");
        assert!(std::fs::read_dir(&incoming).map_or(true, |d| d.count() == 0), "refused uploads leave nothing staged");

        let r0 = put(&mut client, shard.path(), "secret", 0).await.unwrap();
        assert_eq!((r0.files, r0.bytes), (2, weights.len() as u64 + 2));
        let r1 = put(&mut client, shard.path(), "secret", 1).await.unwrap();
        // Rank 0 may not claim rank 1's upload, nor call an upload staged.
        let claim =
            |rank: u32, upload: &str| ReportRequest { checkpoint: Some(Out::CheckpointUpload(upload.into())), ..request("secret", rank) };
        let status = client.report(claim(0, &r1.upload)).await.unwrap_err();
        assert!(status.message().contains("is rank 1's, not rank 0's"), "{}", status.message());
        let both = ReportRequest { checkpoint_staged: true, ..claim(0, &r0.upload) };
        let status = client.report(both).await.unwrap_err();
        assert!(status.message().contains("checkpoint_staged goes with checkpoint_dir"), "{}", status.message());
        assert!(client.report(claim(0, "rank-0-nope")).await.unwrap_err().message().contains("unknown checkpoint upload"));

        let (mut c0, mut c1) = (client.clone(), client.clone());
        let (q0, q1) = (claim(0, &r0.upload), claim(1, &r1.upload));
        let rank0 = tokio::spawn(async move { c0.report(q0).await });
        let rank1 = tokio::spawn(async move { c1.report(q1).await });
        let ev = rx.recv().await.unwrap();
        let crate::EventKind::Report { report, reply } = ev.kind else { panic!("expected a report") };
        let ckpt = report.checkpoint.unwrap();
        assert_eq!(ckpt.ranks, vec![0, 1]);
        for r in 0..2 {
            let at = std::path::Path::new(&ckpt.uri).join(format!("rank-{r}"));
            assert_eq!(std::fs::read(at.join("model.bin")).unwrap(), weights);
            assert_eq!(std::fs::read(at.join("opt/state.json")).unwrap(), b"{}");
        }
        reply.send(Directive::Continue).durable();
        rank0.await.unwrap().unwrap();
        rank1.await.unwrap().unwrap();
        assert_eq!(std::fs::read_dir(&incoming).unwrap().count(), 0, "claimed uploads are removed once persisted");
        // An upload no report claims goes when the run ends.
        put(&mut client, shard.path(), "secret", 0).await.unwrap();
        assert_eq!(std::fs::read_dir(&incoming).unwrap().count(), 1);
        // This run resumes from nothing.
        let fetch =
            |rank: u32| ShardRequest { version: 1, trial_id: "t1".into(), token: "secret".into(), rank, path: String::new(), whole: false };
        assert_eq!(client.get_shard(fetch(0)).await.unwrap_err().code(), tonic::Code::NotFound);
        drop(registration);
        assert!(!incoming.exists(), "the run's end removes unclaimed uploads");

        // The next run resumes from that checkpoint: each rank gets its shard whole.
        spec.checkpoint = Some(PathBuf::from(&ckpt.uri));
        std::fs::write(std::path::Path::new(&ckpt.uri).join("rank-1/model.bin"), b"rank 1's own").unwrap();
        let _registration = server.register(&spec, "secret".into(), Vec::new(), tx);
        for (rank, want) in [(0u32, weights.clone()), (1, b"rank 1's own".to_vec())] {
            let out = fetched(&mut client, fetch(rank)).await;
            assert_eq!(std::fs::read(out.path().join("model.bin")).unwrap(), want);
            assert_eq!(std::fs::read(out.path().join("opt/state.json")).unwrap(), b"{}");
        }
        // Or every rank's part, each under rank-<r>/ (a sharded checkpoint loads from all of them).
        let out = fetched(&mut client, ShardRequest { whole: true, ..fetch(1) }).await;
        assert_eq!(std::fs::read(out.path().join("rank-0/model.bin")).unwrap(), weights);
        assert_eq!(std::fs::read(out.path().join("rank-1/model.bin")).unwrap(), b"rank 1's own");
        assert_eq!(std::fs::read(out.path().join("rank-1/opt/state.json")).unwrap(), b"{}");
        let wrong = ShardRequest { token: "nope".into(), ..fetch(0) };
        assert_eq!(client.get_shard(wrong).await.unwrap_err().code(), tonic::Code::Unauthenticated);
    }

    /// What `GetShard` sends for `request`, written into a new directory.
    async fn fetched(client: &mut ReporterClient<tonic::transport::Channel>, request: ShardRequest) -> tempfile::TempDir {
        let mut chunks = client.get_shard(request).await.unwrap().into_inner();
        let out = tempfile::tempdir().unwrap();
        let mut w = ChunkWriter::new(out.path()).unwrap();
        while let Some(c) = chunks.message().await.unwrap() {
            w.write(&c).unwrap();
        }
        out
    }

    #[tokio::test]
    async fn bad_reports_are_refused_and_change_nothing() {
        let (_server, mut rx, mut client, dir, registration) = setup().await;
        let status = client.report(request("wrong", 0)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert_eq!(status.message(), "unknown trial or wrong token (the token is the run's bearer secret)");
        let status = client.report(request("", 0)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        let status = client.report(ReportRequest { trial_id: "t9".into(), ..request("secret", 0) }).await.unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::Unauthenticated, "unknown trial or wrong token (the token is the run's bearer secret)"),
            "the same answer as a wrong token"
        );
        let status = client.report(request("secret", 3)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("rank 3 out of range"));
        let status = client.report(ReportRequest { version: 2, ..request("secret", 0) }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let missing = dir.path().join("no-such-dir");
        let status = client
            .report(ReportRequest { checkpoint: Some(Out::CheckpointDir(missing.display().to_string())), ..request("secret", 0) })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().ends_with("is not a directory"), "{}", status.message());
        // A directory the worker has no business checkpointing from.
        let status =
            client.report(ReportRequest { checkpoint: Some(Out::CheckpointDir("/etc".into())), ..request("secret", 0) }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().starts_with("checkpoint /etc is outside the directories a worker may checkpoint from ("),
            "{}",
            status.message()
        );
        let file = dir.path().join("file.txt");
        std::fs::write(&file, b"x").unwrap();
        let status = client
            .report(ReportRequest { checkpoint: Some(Out::CheckpointDir(file.display().to_string())), ..request("secret", 0) })
            .await
            .unwrap_err();
        assert!(status.message().ends_with("is not a directory"), "{}", status.message());
        let huge = ReportRequest { metrics: (0..40_000).map(|i| (format!("metric_{i:08}"), 1.0)).collect(), ..request("secret", 0) };
        assert!(client.report(huge).await.is_err(), "oversized reports are refused");
        assert!(rx.try_recv().is_err(), "nothing reached the trial");
        assert!(!dir.path().join("checkpoint_000001").exists());

        // A good report goes through, is numbered 1, and gets the driver's answer.
        let answer = tokio::spawn(async move {
            let ev = rx.recv().await.unwrap();
            let crate::EventKind::Report { report, reply } = ev.kind else { panic!("expected a report") };
            assert_eq!(report.training_iteration, 1);
            assert_eq!(report.metrics["loss"], 0.5);
            reply.send(Directive::Stop).durable();
        });
        let reply = client.report(request("secret", 0)).await.unwrap().into_inner();
        assert_eq!(reply.directive, proto::Directive::Stop as i32);
        assert_eq!(reply.training_iteration, 1);
        answer.await.unwrap();

        // Once its registration is dropped, the trial's reports are refused.
        drop(registration);
        let status = client.report(request("secret", 0)).await.unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::Unauthenticated, "unknown trial or wrong token (the token is the run's bearer secret)")
        );
    }

    #[test]
    fn refusal_logs_are_escaped_and_bounded_per_sender() {
        assert_eq!(super::shown("t1\n2026-11-28T00:00:00Z  INFO forged", 80), "t1\\n2026-11-28T00:00:00Z  INFO forged");
        assert_eq!(super::shown("the run's", 80), "the run's", "only control characters are escaped");
        assert_eq!(super::shown(&"x".repeat(500), 80).len(), 83, "cut short");
        let log = super::RefusalLog::default();
        let logged = (0..2_000).filter(|i| log.refused("report", &format!("10.0.0.9:{}", 40_000 + i), "t", 0, "no")).count();
        assert_eq!(logged, super::REFUSALS_LOGGED as usize, "one sender, many ports: one budget");
        assert!(log.refused("report", "10.0.0.8:1", "t", 0, "no"), "another sender has its own");
        // Many senders: the table stays bounded.
        for i in 0..3 * super::REFUSAL_HOSTS {
            let _ = log.refused("report", &format!("h{i}:1"), "t", 0, "no");
        }
        assert_eq!(log.by_host.lock().unwrap().len(), super::REFUSAL_HOSTS + 1);
    }

    /// A message whose `metrics` field (5) is a number: not a map of doubles.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Malformed {
        #[prost(uint32, tag = "1")]
        version: u32,
        #[prost(string, tag = "2")]
        trial_id: String,
        #[prost(string, tag = "3")]
        token: String,
        #[prost(uint64, tag = "5")]
        metrics: u64,
    }

    #[tokio::test]
    async fn malformed_and_huge_messages_are_refused() {
        let (server, mut rx, mut client, _dir, _registration) = setup().await;
        let mut grpc = tonic::client::Grpc::new(tonic::transport::Channel::from_shared(server.url()).unwrap().connect().await.unwrap());
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<Malformed, ReportReply>::default();
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/nestor.v1.Reporter/Report");
        let bad = Malformed { version: 1, trial_id: "t1".into(), token: "secret".into(), metrics: 7 };
        let status = grpc.unary(Request::new(bad), path, codec).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
        assert!(status.message().contains("decode"), "{}", status.message());

        // 100 MB of metrics in one message.
        let huge = ReportRequest { metrics: [("m".repeat(100 << 20), 1.0)].into_iter().collect(), ..request("secret", 0) };
        let status = client.report(huge).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
        assert!(rx.try_recv().is_err(), "nothing reached the trial");
    }

    /// The driver's side of the next step to reach it.
    async fn next_step(rx: &mut mpsc::UnboundedReceiver<Event>) -> crate::Reply {
        let ev = rx.recv().await.expect("the step reached the driver");
        let crate::EventKind::Report { reply, .. } = ev.kind else { panic!("expected a report") };
        reply
    }

    /// A report stream: answered with each decision at once, told how far
    /// it is acknowledged, and ended by the driver once all of it is durable.
    #[tokio::test]
    async fn a_session_is_answered_at_once_and_closes_once_its_reports_are_durable() {
        let (_server, mut rx, mut client, _dir, _registration) = setup().await;
        let (tx, requests) = mpsc::channel(4);
        let mut replies = client.session(tokio_stream::wrappers::ReceiverStream::new(requests)).await.unwrap().into_inner();
        tx.send(request("secret", 0)).await.unwrap();
        let ack1 = next_step(&mut rx).await.send(Directive::Continue);
        let r1 = replies.message().await.unwrap().unwrap();
        assert_eq!((r1.directive, r1.training_iteration, r1.acknowledged_iteration), (proto::Directive::Continue as i32, 1, 0));

        // Step 1 becomes durable before step 2 is answered.
        tx.send(request("secret", 0)).await.unwrap();
        let reply = next_step(&mut rx).await;
        ack1.durable();
        let ack2 = reply.send(Directive::Continue);
        let r2 = replies.message().await.unwrap().unwrap();
        assert_eq!((r2.training_iteration, r2.acknowledged_iteration), (2, 1), "step 1 acknowledged with the answer to step 2");

        // Closing our side: the stream ends once step 2 is durable, not before.
        drop(tx);
        let end = tokio::spawn(async move { replies.message().await });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!end.is_finished(), "step 2 is not durable yet");
        ack2.durable();
        assert!(end.await.unwrap().unwrap().is_none(), "ended OK: everything sent is durable");

        // A step answered and never stored: the close says so.
        let (tx, requests) = mpsc::channel(4);
        let mut replies = client.session(tokio_stream::wrappers::ReceiverStream::new(requests)).await.unwrap().into_inner();
        tx.send(request("secret", 0)).await.unwrap();
        drop(next_step(&mut rx).await.send(Directive::Stop));
        assert_eq!(replies.message().await.unwrap().unwrap().training_iteration, 3);
        drop(tx);
        let status = replies.message().await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("step 3 was answered but is not durable"), "{}", status.message());
    }

    #[tokio::test]
    async fn ranks_are_answered_together_once_all_have_reported() {
        let server = ReportServer::start(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let dir = tempfile::tempdir().unwrap();
        let mut spec = crate::LaunchSpec::new("t1", serde_json::json!({}), dir.path());
        spec.workers = vec![crate::WorkerBundle::cpus(1.0); 2];
        let _registration = server.register(&spec, "secret".into(), spec.roots(None), tx);
        let shard = tempfile::tempdir().unwrap();
        std::fs::write(shard.path().join("w.bin"), b"rank 1").unwrap();
        let mut c1 = ReporterClient::connect(server.url()).await.unwrap();
        let ckpt = shard.path().display().to_string();
        let rank1 = tokio::spawn(async move {
            c1.report(ReportRequest {
                checkpoint: Some(Out::CheckpointDir(ckpt)),
                metrics: [("loss".to_string(), 9.0)].into(),
                ..request("secret", 1)
            })
            .await
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(rx.try_recv().is_err(), "rank 0 has not reported");
        let mut c0 = ReporterClient::connect(server.url()).await.unwrap();
        let rank0 = tokio::spawn(async move { c0.report(request("secret", 0)).await });
        let ev = rx.recv().await.unwrap();
        let crate::EventKind::Report { report, reply } = ev.kind else { panic!("expected a report") };
        assert_eq!((report.rank, report.metrics["loss"]), (0, 0.5), "rank 0's metrics are the trial's");
        let ckpt = report.checkpoint.unwrap();
        assert_eq!((ckpt.ranks.as_slice(), ckpt.world_size), (&[1][..], 2), "rank 1 alone saved a shard");
        assert_eq!(std::fs::read(std::path::Path::new(&ckpt.uri).join("rank-1/w.bin")).unwrap(), b"rank 1");
        reply.send(Directive::Continue).durable();
        for r in [rank0.await.unwrap().unwrap(), rank1.await.unwrap().unwrap()] {
            assert_eq!(r.into_inner().directive, proto::Directive::Continue as i32);
        }
    }
}
