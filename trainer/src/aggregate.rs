//! A trial's step aggregator: collects every rank's report of a step, and
//! hands the step to the driver once all ranks (that are still running) have
//! reported it. Fed by the trial's report intake, whether its ranks report
//! over gRPC or in-process.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use crate::ack::{Acknowledged, Watermark};
use crate::backend::{CheckpointRef, Directive, Event, EventKind, Reply, Report, StepProgress};

/// Why a rank's report was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ArriveError {
    /// The rank is outside the trial's world.
    #[error("rank {rank} out of range: trial `{trial}` has {world_size} workers")]
    Rank { trial: String, rank: u32, world_size: u32 },
    /// Two reports of one rank for the same step (concurrent calls).
    #[error("rank {rank} reported step {iteration} twice")]
    Duplicate { rank: u32, iteration: u64 },
}

#[derive(Debug)]
struct Step {
    arrived: Vec<bool>,
    /// (rank, metrics) of the lowest rank so far.
    metrics: Option<(u32, BTreeMap<String, f64>, Option<serde_json::Value>)>,
    /// Every rank's metrics, by rank (several ranks only).
    all: Vec<Option<BTreeMap<String, f64>>>,
    /// The checkpoint's URI and the ranks that saved a shard of it.
    checkpoint: Option<String>,
    shards: Vec<u32>,
    waiters: Vec<oneshot::Sender<Directive>>,
}

#[derive(Debug)]
struct State {
    /// Set when a rank failed: no step completes any more.
    failed: bool,
    /// Next iteration per rank.
    next: Vec<u64>,
    /// Ranks that have ended: no step waits for them.
    finished: Vec<bool>,
    steps: BTreeMap<u64, Step>,
}

/// One trial's aggregator.
#[derive(Debug)]
pub(crate) struct Aggregator {
    trial_id: String,
    world_size: u32,
    events: mpsc::UnboundedSender<Event>,
    state: Mutex<State>,
    /// How far the run's steps are durable in the driver's store.
    acks: Arc<Watermark>,
    /// The node's per-trial GPU figures, added to each report.
    gpu: Option<Arc<crate::gpu_usage::GpuUsage>>,
}

impl Aggregator {
    pub(crate) fn new(trial_id: &str, world_size: u32, start_iteration: u64, events: mpsc::UnboundedSender<Event>) -> Self {
        let n = world_size as usize;
        Self {
            trial_id: trial_id.to_string(),
            world_size,
            events,
            acks: Watermark::new(start_iteration),
            state: Mutex::new(State {
                failed: false,
                next: vec![start_iteration + 1; n],
                finished: vec![false; n],
                steps: BTreeMap::new(),
            }),
            gpu: None,
        }
    }

    /// Adds the node's GPU figures for the trial to each of its reports
    /// (a metric of the run's own name wins).
    pub(crate) fn with_gpu(mut self, gpu: Arc<crate::gpu_usage::GpuUsage>) -> Self {
        self.gpu = Some(gpu);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent state (no partial updates), so poison is ignored.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check_rank(&self, rank: u32) -> Result<usize, ArriveError> {
        if rank < self.world_size {
            Ok(rank as usize)
        } else {
            Err(ArriveError::Rank { trial: self.trial_id.clone(), rank, world_size: self.world_size })
        }
    }

    /// The iteration `rank`'s next report will be (its checkpoint goes to
    /// that iteration's directory before it arrives).
    pub(crate) fn next_iteration(&self, rank: u32) -> Result<u64, ArriveError> {
        let r = self.check_rank(rank)?;
        Ok(self.lock().next[r])
    }

    /// Watches how far the run's steps are acknowledged (durable).
    pub(crate) fn acknowledged(&self) -> Acknowledged {
        self.acks.watch()
    }

    /// How far the run's steps are acknowledged now.
    pub(crate) fn acknowledged_through(&self) -> u64 {
        self.acks.through()
    }

    /// `rank` reports `iteration`; the receiver gets the driver's decision
    /// once the step is complete and decided on.
    pub(crate) fn arrive(
        &self,
        rank: u32,
        iteration: u64,
        metrics: BTreeMap<String, f64>,
        extra: Option<serde_json::Value>,
        checkpoint: Option<String>,
    ) -> Result<oneshot::Receiver<Directive>, ArriveError> {
        let r = self.check_rank(rank)?;
        let (tx, rx) = oneshot::channel();
        let mut st = self.lock();
        if st.next[r] != iteration {
            return Err(ArriveError::Duplicate { rank, iteration });
        }
        st.next[r] += 1;
        let n = self.world_size as usize;
        let step = st.steps.entry(iteration).or_insert_with(|| Step {
            arrived: vec![false; n],
            metrics: None,
            all: if n > 1 { vec![None; n] } else { Vec::new() },
            checkpoint: None,
            shards: Vec::new(),
            waiters: Vec::new(),
        });
        step.arrived[r] = true;
        if let Some(slot) = step.all.get_mut(r) {
            *slot = Some(metrics.clone());
        }
        if step.metrics.as_ref().is_none_or(|(lowest, _, _)| rank < *lowest) {
            step.metrics = Some((rank, metrics, extra));
        }
        if checkpoint.is_some() {
            step.checkpoint = checkpoint;
            step.shards.push(rank);
        }
        step.waiters.push(tx);
        self.complete_ready(&mut st);
        Ok(rx)
    }

    /// A rank failed: the steps it never reported are dropped (their waiting
    /// ranks read Stop), and none completes any more. A step without every
    /// rank's report, and so maybe without every rank's checkpoint shard, is
    /// never a result.
    pub(crate) fn fail(&self) {
        let mut st = self.lock();
        st.failed = true;
        if let Some(&first) = st.steps.keys().next() {
            // Never stored, so never acknowledged: nobody waits for it.
            drop(self.acks.owe(first));
        }
        st.steps.clear();
    }

    /// The running ranks that have reported the fewest steps, when not all
    /// running ranks are level (the ones a step waits for), or when some
    /// rank has ended already (the run waits for the others to end).
    pub(crate) fn lagging_ranks(&self) -> Vec<u32> {
        let st = self.lock();
        let live: Vec<(u32, u64)> =
            st.next.iter().zip(&st.finished).enumerate().filter(|(_, (_, f))| !**f).map(|(r, (n, _))| (r as u32, *n)).collect();
        let (Some(low), Some(high)) = (live.iter().map(|l| l.1).min(), live.iter().map(|l| l.1).max()) else { return Vec::new() };
        if low == high && !st.finished.iter().any(|&f| f) {
            return Vec::new();
        }
        live.into_iter().filter(|l| l.1 == low).map(|l| l.0).collect()
    }

    /// `rank` has ended cleanly: steps no longer wait for it.
    pub(crate) fn rank_finished(&self, rank: u32) {
        let Ok(r) = self.check_rank(rank) else { return };
        let mut st = self.lock();
        st.finished[r] = true;
        self.complete_ready(&mut st);
    }

    /// Sends every step that all live ranks have reported, in order.
    fn complete_ready(&self, st: &mut State) {
        if st.failed {
            // Dropping the waiters tells the ranks to stop.
            if let Some(&first) = st.steps.keys().next() {
                drop(self.acks.owe(first));
            }
            st.steps.clear();
            return;
        }
        while let Some((&iteration, step)) = st.steps.first_key_value() {
            let done = step.arrived.iter().zip(&st.finished).all(|(a, f)| *a || *f);
            if !done {
                return;
            }
            let Some((_, step)) = st.steps.remove_entry(&iteration) else { return };
            let Some((rank, metrics, extra)) = step.metrics else { continue };
            let mut ranks = step.shards;
            ranks.sort_unstable();
            let checkpoint = step.checkpoint.map(|uri| CheckpointRef { uri, ranks, world_size: self.world_size });
            let rank_metrics = step.all.into_iter().map(Option::unwrap_or_default).collect();
            let mut metrics = metrics;
            if let Some(gpu) = &self.gpu {
                for (name, value) in gpu.take(&self.trial_id) {
                    metrics.entry(name).or_insert(value);
                }
            }
            let report = Report { rank, training_iteration: iteration, metrics, extra, checkpoint, rank_metrics };
            let event = Event {
                trial_id: self.trial_id.clone(),
                kind: EventKind::Report { report, reply: Reply::new(step.waiters, self.acks.owe(iteration)) },
            };
            // A driver that is gone drops the reply: the ranks read Stop.
            let _ = self.events.send(event);
        }
    }
}

impl StepProgress for Aggregator {
    fn lagging_ranks(&self) -> Vec<u32> {
        Aggregator::lagging_ranks(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(v: f64) -> BTreeMap<String, f64> {
        BTreeMap::from([("loss".to_string(), v)])
    }

    #[test]
    fn a_step_goes_out_once_every_rank_reported_it_with_rank_0s_metrics() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let agg = Aggregator::new("t", 3, 4, tx);
        assert_eq!(agg.next_iteration(2).unwrap(), 5);
        let r2 = agg.arrive(2, 5, metrics(2.0), None, Some("ck".to_string())).unwrap();
        let r1 = agg.arrive(1, 5, metrics(1.0), None, None).unwrap();
        assert!(rx.try_recv().is_err(), "rank 0 has not reported yet");
        assert_eq!(agg.lagging_ranks(), vec![0], "the step waits for rank 0");
        let r0 = agg.arrive(0, 5, metrics(0.5), None, None).unwrap();
        assert_eq!(agg.lagging_ranks(), Vec::<u32>::new(), "all level: no step waits");
        let ev = rx.try_recv().unwrap();
        let EventKind::Report { report, reply } = ev.kind else { panic!("a report") };
        assert_eq!((report.rank, report.training_iteration, report.metrics["loss"]), (0, 5, 0.5));
        let by_rank: Vec<f64> = report.rank_metrics.iter().map(|m| m["loss"]).collect();
        assert_eq!(by_rank, vec![0.5, 1.0, 2.0], "every rank's metrics, by rank");
        assert_eq!(report.checkpoint, Some(CheckpointRef { uri: "ck".into(), ranks: vec![2], world_size: 3 }));
        let acks = agg.acknowledged();
        assert_eq!(acks.through(), 4, "the checkpoint's steps");
        let ack = reply.send(Directive::Stop);
        for mut r in [r0, r1, r2] {
            assert_eq!(r.try_recv().unwrap(), Directive::Stop, "every rank gets the decision");
        }
        assert_eq!(acks.through(), 4, "answered, not yet durable");
        ack.durable();
        assert_eq!(acks.through(), 5);
        assert_eq!(agg.arrive(0, 5, metrics(0.0), None, None).unwrap_err(), ArriveError::Duplicate { rank: 0, iteration: 5 });
        assert!(matches!(agg.arrive(3, 6, metrics(0.0), None, None), Err(ArriveError::Rank { .. })));
    }

    /// The node's GPU figures for the trial ride on its reports; a metric
    /// the run reports under the same name is the run's.
    #[test]
    fn a_report_carries_the_trials_gpu_figures_and_the_runs_own_metric_wins() {
        use crate::gpu_usage::{DeviceRead, GpuUsage, Holding, ProcessRead};
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gpu = Arc::new(GpuUsage::default());
        let agg = Aggregator::new("t", 1, 0, tx).with_gpu(Arc::clone(&gpu));
        gpu.start("t", Holding { gpus: [0].into(), groups: [7].into() });
        let read = DeviceRead {
            index: 0,
            util_percent: 64.0,
            memory_used: 5 << 30,
            processes: vec![ProcessRead { pid: 7, memory_bytes: Some(3 << 30), sm_percent: None }],
            per_process_util: false,
        };
        gpu.record(&[read], |pid| (pid == 7).then_some(7));
        let mut own = metrics(1.0);
        own.insert("gpu_util_peak_percent".into(), -1.0);
        let _r = agg.arrive(0, 1, own, None, None).unwrap();
        let EventKind::Report { report, .. } = rx.try_recv().unwrap().kind else { panic!("a report") };
        assert_eq!(report.metrics["loss"], 1.0);
        assert_eq!(report.metrics["gpu_util_percent"], 64.0);
        assert_eq!(report.metrics["gpu_memory_peak_bytes"], (3u64 << 30) as f64, "its process's memory, not the device's");
        assert_eq!(report.metrics["gpu_util_peak_percent"], -1.0, "the run's own metric of that name");
        // A trial of no GPU reports no GPU figures.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let other = Aggregator::new("u", 1, 0, tx).with_gpu(gpu);
        let _r = other.arrive(0, 1, metrics(2.0), None, None).unwrap();
        let EventKind::Report { report, .. } = rx.try_recv().unwrap().kind else { panic!("a report") };
        assert_eq!(report.metrics.keys().collect::<Vec<_>>(), ["loss"]);
    }

    #[test]
    fn a_finished_rank_is_not_waited_for() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let agg = Aggregator::new("t", 2, 0, tx);
        let _r1 = agg.arrive(1, 1, metrics(1.0), None, None).unwrap();
        agg.rank_finished(0);
        let EventKind::Report { report, .. } = rx.try_recv().unwrap().kind else { panic!("a report") };
        assert_eq!((report.rank, report.training_iteration), (1, 1), "the lowest live rank's metrics");
        // Dropping the reply stops the waiting ranks.
        let mut r = agg.arrive(1, 2, metrics(1.0), None, None).unwrap();
        drop(rx.try_recv().unwrap());
        assert!(r.try_recv().is_err());
        // Rank 0 has ended: the run waits for rank 1 to end (a rank stuck after its last step is named).
        assert_eq!(agg.lagging_ranks(), vec![1]);
    }

    #[test]
    fn after_a_rank_fails_no_step_completes() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let agg = Aggregator::new("t", 2, 0, tx);
        let mut waiting = agg.arrive(0, 1, metrics(1.0), None, Some("ck".to_string())).unwrap();
        agg.fail();
        assert!(matches!(waiting.try_recv(), Err(oneshot::error::TryRecvError::Closed)), "rank 0 is told to stop");
        let mut late = agg.arrive(0, 2, metrics(1.0), None, None).unwrap();
        agg.rank_finished(1);
        assert!(rx.try_recv().is_err(), "the step rank 1 never reported is not a result");
        assert!(matches!(late.try_recv(), Err(oneshot::error::TryRecvError::Closed)));
    }
}
