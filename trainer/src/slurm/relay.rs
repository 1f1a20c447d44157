//! `nestor relay-output`: inside a trial's Slurm job whose node does not
//! see the experiment's directory, the job's output (its batch script's
//! lines and srun's labelled ones) goes to the driver over the report
//! channel (`JobOutput`) instead of into a file the driver reads.
//!
//! The job must never wait on the driver: what is read from the job is
//! queued (up to [`QUEUED_BYTES`]) while the driver is slow or being
//! reached again, and dropped past that (counted, said once the driver
//! answers again), so a rank writing to its output never blocks.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::Notify;

use crate::proto::{self, OutputChunk};

/// The most output held for the driver at once.
const QUEUED_BYTES: usize = 16 << 20;

/// How long to keep trying a driver that does not answer once the job's
/// output has ended (the job is over; its last lines wait no longer).
const LAST_TRIES: Duration = Duration::from_secs(30);

/// What the job wrote and the driver has not had yet.
#[derive(Default)]
struct Queue {
    chunks: VecDeque<Vec<u8>>,
    bytes: usize,
    /// Bytes dropped since the driver last took any.
    dropped: u64,
    /// The job's output has ended.
    ended: bool,
}

/// Who the output is sent as: the run's report address and credentials.
#[derive(Debug, Clone)]
pub struct RelayTarget {
    /// The driver's address (the plan's channel).
    pub addr: String,
    /// The trial's id.
    pub trial_id: String,
    /// The run's token.
    pub token: String,
    /// Over TLS, the authority the driver's certificate is signed by.
    pub ca: Option<String>,
}

impl RelayTarget {
    /// The run's target from the plan a job's batch script has (`NESTOR_RUN`, `NESTOR_TOKEN`).
    pub fn from_env() -> Result<Self, String> {
        let (plan, token) = crate::contract::RunPlan::from_env().map_err(|e| format!("{e} (run inside a nestor trial's job)"))?;
        Ok(Self { addr: plan.channel.addr, trial_id: plan.trial.id, token, ca: plan.channel.tls_ca })
    }
}

/// Sends everything read from `input` to the driver, until `input` ends
/// and the driver has it all (or stops answering for 30 s
/// after that). Returns the bytes the driver took and the bytes dropped.
pub async fn relay_output(target: RelayTarget, mut input: impl AsyncRead + Unpin + Send + 'static) -> Result<(u64, u64), String> {
    let endpoint = crate::tls::endpoint(&target.addr, target.ca.as_deref())?.connect_timeout(Duration::from_secs(10));
    let queue = Arc::new(Mutex::new(Queue::default()));
    let more = Arc::new(Notify::new());
    let reader = {
        let (queue, more) = (Arc::clone(&queue), Arc::clone(&more));
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = input.read(&mut buf).await.unwrap_or(0);
                let mut q = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if n == 0 {
                    q.ended = true;
                    drop(q);
                    more.notify_one();
                    return;
                }
                if q.bytes + n > QUEUED_BYTES {
                    q.dropped += n as u64;
                } else {
                    q.bytes += n;
                    q.chunks.push_back(buf[..n].to_vec());
                }
                drop(q);
                more.notify_one();
            }
        })
    };
    let (mut sent, mut dropped) = (0u64, 0u64);
    let mut failing_since: Option<tokio::time::Instant> = None;
    loop {
        let channel = endpoint.connect_lazy();
        let mut client = proto::reporter_client::ReporterClient::new(channel);
        // One call for as long as the driver takes what comes; a chunk is
        // taken off the queue only when handed to the call.
        let chunks = futures_util::stream::unfold((Arc::clone(&queue), Arc::clone(&more), target.clone()), |(queue, more, t)| async move {
            loop {
                let notified = more.notified();
                {
                    let mut q = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let mut data = Vec::new();
                    if q.dropped > 0 {
                        data.extend_from_slice(
                            format!("nestor: {} bytes of this job's output were dropped while the driver did not answer\n", q.dropped)
                                .as_bytes(),
                        );
                        q.dropped = 0;
                    }
                    while let Some(c) = q.chunks.pop_front() {
                        q.bytes -= c.len();
                        data.extend_from_slice(&c);
                        if data.len() >= 64 << 10 {
                            break;
                        }
                    }
                    if !data.is_empty() {
                        let chunk = OutputChunk { version: 1, trial_id: t.trial_id.clone(), token: t.token.clone(), data };
                        return Some((chunk, (Arc::clone(&queue), Arc::clone(&more), t)));
                    }
                    if q.ended {
                        return None;
                    }
                }
                notified.await;
            }
        });
        match client.job_output(chunks).await {
            Ok(receipt) => {
                sent += receipt.into_inner().bytes;
                let q = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if q.ended && q.chunks.is_empty() && q.dropped == 0 {
                    break;
                }
                failing_since = None;
            }
            Err(status) => {
                // What the failed call had taken is lost.
                let ended = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).ended;
                if matches!(
                    status.code(),
                    tonic::Code::Unauthenticated | tonic::Code::NotFound | tonic::Code::FailedPrecondition | tonic::Code::InvalidArgument
                ) {
                    // The run is over for the driver (or never was one): nothing will take it. The job's
                    // output is still read to its end, so that nothing writing it dies of a closed pipe.
                    let _ = reader.await;
                    return Err(format!("the driver at {} refused the job's output: {}", target.addr, status.message()));
                }
                let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                if ended && since.elapsed() > LAST_TRIES {
                    let q = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    dropped += q.bytes as u64 + q.dropped;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    let _ = reader.await;
    Ok((sent, dropped))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::service::ReportServer;

    fn target(server: &ReportServer, token: &str) -> RelayTarget {
        RelayTarget { addr: server.url(), trial_id: "t1".into(), token: token.into(), ca: server.ca_pem().map(String::from) }
    }

    /// Megabytes of output reach the run whole and in order; a wrong token
    /// and a run that takes no job output are refused, the input still read
    /// to its end (nothing writing it dies of a closed pipe).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_jobs_output_reaches_its_run_whole_and_in_order() {
        // Over TLS, as from a job on another node.
        let server = ReportServer::start_encrypted(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        assert!(server.url().starts_with("https://"), "{}", server.url());
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::LaunchSpec::new("t1", serde_json::json!({}), dir.path());
        let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
        let mut registration = server.register(&spec, "secret".into(), Vec::new(), events.clone());
        let mut lines = registration.take_output().unwrap();
        assert!(registration.take_output().is_none(), "taken once");
        let text: Vec<u8> = (0..100_000).flat_map(|i| format!("    {}: line {i} of the job\n", i % 4).into_bytes()).collect();
        // Read as it comes: the driver holds a bounded number of chunks.
        let want = text.len();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while got.len() < want {
                let Some(chunk) = lines.recv().await else { break };
                got.extend(chunk);
            }
            (got, lines)
        });
        let (sent, dropped) = relay_output(target(&server, "secret"), std::io::Cursor::new(text.clone())).await.unwrap();
        assert_eq!((sent, dropped), (text.len() as u64, 0));
        let (got, lines) = reader.await.unwrap();
        assert!(got == text, "{} bytes came, {} were sent", got.len(), text.len());
        let refused = relay_output(target(&server, "wrong"), std::io::Cursor::new(text.clone())).await.unwrap_err();
        assert!(refused.contains("refused the job's output") && refused.contains("unknown trial or wrong token"), "{refused}");
        drop(lines);
        let refused = relay_output(target(&server, "secret"), std::io::Cursor::new(b"x\n".to_vec())).await.unwrap_err();
        assert!(refused.contains("runs no job whose output comes here"), "{refused}");
        drop(registration);
    }
}
