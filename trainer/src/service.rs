//! The driver's gRPC report service: routes each worker's report to its
//! trial, after checking the trial's token and persisting the checkpoint.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::ack::Acknowledged;
use crate::aggregate::Aggregator;
use crate::backend::{Directive, Event};
use crate::intake::{Intake, IntakeError};
use crate::proto::reporter_server::{Reporter, ReporterServer};
use crate::proto::{self, ReportReply, ReportRequest};

/// Largest report accepted, in bytes.
pub const MAX_REPORT_BYTES: usize = 1 << 20;

/// A registered trial: its secret and its report intake.
struct Entry {
    token: String,
    intake: Arc<Intake>,
}

#[derive(Default)]
struct Registry {
    trials: RwLock<HashMap<String, Arc<Entry>>>,
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
}

impl std::fmt::Debug for ReportServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportServer").field("addr", &self.addr).finish()
    }
}

impl ReportServer {
    /// Binds `bind` (use port 0 for a free port) and serves until dropped.
    pub async fn start(bind: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let registry = Arc::new(Registry::default());
        let service = ReporterServer::new(Service { registry: Arc::clone(&registry) }).max_decoding_message_size(MAX_REPORT_BYTES);
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            // Reports are small request/response pairs: no Nagle delay on them.
            let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |conn| {
                conn.inspect(|c| {
                    let _ = c.set_nodelay(true);
                })
            });
            let result = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "report server failed");
            }
        });
        Ok(Self { addr, registry, shutdown: Some(tx) })
    }

    /// The address workers report to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL workers get in `NESTOR_ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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
        let aggregator = Arc::new(Aggregator::new(&spec.trial_id, spec.world_size(), spec.start_iteration, events));
        let intake = Arc::new(Intake::new(spec.storage.clone(), roots, aggregator));
        let entry = Entry { token, intake: Arc::clone(&intake) };
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
}

fn tokens_equal(a: &str, b: &str) -> bool {
    // Length leaks nothing useful (tokens have a fixed length); compare every byte.
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks one report, persists its checkpoint shard, hands it to its trial's
/// aggregator and waits for the driver's decision. A refusal is logged with
/// the sender and changes nothing. Also returns what watches the run's
/// acknowledgements.
async fn handle(registry: &Registry, r: ReportRequest, peer: &str) -> Result<(ReportReply, Acknowledged), Status> {
    let refuse = |status: Status| {
        tracing::warn!(%peer, trial = %r.trial_id, rank = r.rank, reason = %status.message(), "report refused");
        Err(status)
    };
    if r.version != 1 {
        return refuse(Status::invalid_argument(format!("unsupported protocol version {} (this driver speaks 1)", r.version)));
    }
    let Some(entry) = registry.get(&r.trial_id) else {
        return refuse(Status::not_found(format!("unknown trial `{}`", r.trial_id)));
    };
    if !tokens_equal(&entry.token, &r.token) {
        return refuse(Status::unauthenticated(format!("wrong token for trial `{}`", r.trial_id)));
    }
    let checkpoint = (!r.checkpoint_dir.is_empty()).then(|| PathBuf::from(&r.checkpoint_dir));
    let submitted = entry.intake.submit(r.rank, r.metrics.clone().into_iter().collect(), checkpoint.as_deref()).await;
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

#[tonic::async_trait]
impl Reporter for Service {
    async fn report(&self, request: Request<ReportRequest>) -> Result<Response<ReportReply>, Status> {
        let peer = request.remote_addr().map_or_else(|| "unknown peer".to_string(), |a| a.to_string());
        handle(&self.registry, request.into_inner(), &peer).await.map(|(reply, _)| Response::new(reply))
    }

    type SessionStream = ReplyStream;

    async fn session(&self, request: Request<tonic::Streaming<ReportRequest>>) -> Result<Response<ReplyStream>, Status> {
        let peer = request.remote_addr().map_or_else(|| "unknown peer".to_string(), |a| a.to_string());
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
            checkpoint_dir: String::new(),
        }
    }

    #[tokio::test]
    async fn bad_reports_are_refused_and_change_nothing() {
        let (_server, mut rx, mut client, dir, registration) = setup().await;
        let status = client.report(request("wrong", 0)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert_eq!(status.message(), "wrong token for trial `t1`");
        let status = client.report(request("", 0)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        let status = client.report(ReportRequest { trial_id: "t9".into(), ..request("secret", 0) }).await.unwrap_err();
        assert_eq!((status.code(), status.message()), (tonic::Code::NotFound, "unknown trial `t9`"));
        let status = client.report(request("secret", 3)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("rank 3 out of range"));
        let status = client.report(ReportRequest { version: 2, ..request("secret", 0) }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let missing = dir.path().join("no-such-dir");
        let status =
            client.report(ReportRequest { checkpoint_dir: missing.display().to_string(), ..request("secret", 0) }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().ends_with("is not a directory"), "{}", status.message());
        // A directory the worker has no business checkpointing from.
        let status = client.report(ReportRequest { checkpoint_dir: "/etc".into(), ..request("secret", 0) }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().starts_with("checkpoint /etc is outside the directories a worker may checkpoint from ("),
            "{}",
            status.message()
        );
        let file = dir.path().join("file.txt");
        std::fs::write(&file, b"x").unwrap();
        let status = client.report(ReportRequest { checkpoint_dir: file.display().to_string(), ..request("secret", 0) }).await.unwrap_err();
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
        assert_eq!((status.code(), status.message()), (tonic::Code::NotFound, "unknown trial `t1`"));
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
            c1.report(ReportRequest { checkpoint_dir: ckpt, metrics: [("loss".to_string(), 9.0)].into(), ..request("secret", 1) }).await
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
