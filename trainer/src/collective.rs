//! In-process collectives for Rust workers on threads: `all_reduce`,
//! `broadcast` and `barrier` over `f32` slices. Results are the same on
//! every rank and from run to run: contributions are combined in rank order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::StopLevel;

/// How `all_reduce` combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean over the ranks (gradient averaging).
    Mean,
}

/// Why a collective did not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    /// Another rank ended (returned, failed or panicked) or the trial was
    /// stopped, so the collective can never complete.
    #[error("collective aborted: {0}")]
    Aborted(String),
    /// The ranks passed slices of different lengths, or different roots.
    #[error("collective mismatch: {0}")]
    Mismatch(String),
    /// Only in-process workers have nestor's collectives; worker processes
    /// use their framework's (e.g. `torch.distributed`).
    #[error("collectives are available to in-process workers only; worker processes use their framework's (torch.distributed)")]
    NotInProcess,
}

/// Spins before a rank sleeps waiting for the others (a few microseconds).
const SPIN: u32 = 20_000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reduce(ReduceOp),
    Broadcast(u32),
}

struct State {
    generation: u64,
    arrived: usize,
    kind: Option<Kind>,
    slots: Vec<Option<Vec<f32>>>,
    result: Arc<Result<Vec<f32>, CollectiveError>>,
    aborted: Option<String>,
}

/// The collective group of one trial's in-process ranks.
pub(crate) struct Collective {
    world_size: usize,
    /// `State::generation`, readable without the lock (for a short spin before sleeping).
    generation: AtomicU64,
    state: Mutex<State>,
    cv: Condvar,
    stop: watch::Receiver<StopLevel>,
}

impl Collective {
    pub(crate) fn new(world_size: u32, stop: watch::Receiver<StopLevel>) -> Self {
        let n = world_size as usize;
        Self {
            world_size: n,
            generation: AtomicU64::new(0),
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                kind: None,
                slots: vec![None; n],
                result: Arc::new(Ok(Vec::new())),
                aborted: None,
            }),
            cv: Condvar::new(),
            stop,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// No collective completes from now on (a rank ended or failed).
    pub(crate) fn abort(&self, reason: String) {
        let mut st = self.lock();
        st.aborted.get_or_insert(reason);
        self.cv.notify_all();
    }

    pub(crate) fn all_reduce(&self, rank: u32, data: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        let out = self.exchange(rank, Kind::Reduce(op), Some(data.to_vec()))?;
        data.copy_from_slice(&out);
        Ok(())
    }

    pub(crate) fn broadcast(&self, rank: u32, data: &mut [f32], root: u32) -> Result<(), CollectiveError> {
        if root as usize >= self.world_size {
            return Err(CollectiveError::Mismatch(format!("root {root} out of range: {} ranks", self.world_size)));
        }
        let out = self.exchange(rank, Kind::Broadcast(root), (rank == root).then(|| data.to_vec()))?;
        if out.len() != data.len() {
            return Err(CollectiveError::Mismatch(format!("rank {rank} passed {} values, the root {}", data.len(), out.len())));
        }
        data.copy_from_slice(&out);
        Ok(())
    }

    pub(crate) fn barrier(&self, rank: u32) -> Result<(), CollectiveError> {
        self.exchange(rank, Kind::Reduce(ReduceOp::Sum), Some(Vec::new())).map(|_| ())
    }

    fn exchange(&self, rank: u32, kind: Kind, contribution: Option<Vec<f32>>) -> Result<Vec<f32>, CollectiveError> {
        let r = rank as usize;
        if self.world_size == 1 {
            return Ok(contribution.unwrap_or_default());
        }
        let mut st = self.lock();
        if let Some(why) = &st.aborted {
            return Err(CollectiveError::Aborted(why.clone()));
        }
        if st.kind.is_some_and(|k| k != kind) {
            let msg = format!("rank {rank} entered a different collective than the ranks before it");
            st.aborted = Some(msg.clone());
            self.cv.notify_all();
            return Err(CollectiveError::Mismatch(msg));
        }
        st.kind = Some(kind);
        st.slots[r] = contribution;
        st.arrived += 1;
        let generation = st.generation;
        if st.arrived == self.world_size {
            let slots = std::mem::replace(&mut st.slots, vec![None; self.world_size]);
            st.result = Arc::new(combine(kind, slots));
            st.arrived = 0;
            st.kind = None;
            st.generation += 1;
            self.generation.store(st.generation, Ordering::Release);
            self.cv.notify_all();
        } else {
            // The other ranks are usually microseconds behind: spin briefly
            // before sleeping on the condvar (a wake-up costs far more).
            drop(st);
            for _ in 0..SPIN {
                if self.generation.load(Ordering::Acquire) != generation {
                    break;
                }
                std::hint::spin_loop();
            }
            st = self.lock();
            while st.generation == generation {
                if let Some(why) = &st.aborted {
                    return Err(CollectiveError::Aborted(why.clone()));
                }
                if *self.stop.borrow() > StopLevel::Run {
                    return Err(CollectiveError::Aborted("the trial was stopped".into()));
                }
                // Woken by the last rank or an abort; the timeout only rechecks the stop flag.
                st = self.cv.wait_timeout(st, Duration::from_millis(50)).map_or_else(|e| e.into_inner().0, |(g, _)| g);
            }
        }
        match &*st.result {
            Ok(v) => Ok(v.clone()),
            Err(e) => Err(e.clone()),
        }
    }
}

fn combine(kind: Kind, slots: Vec<Option<Vec<f32>>>) -> Result<Vec<f32>, CollectiveError> {
    match kind {
        Kind::Broadcast(root) => slots
            .into_iter()
            .nth(root as usize)
            .flatten()
            .ok_or_else(|| CollectiveError::Mismatch(format!("the root {root} passed no data"))),
        Kind::Reduce(op) => {
            let n = slots.len();
            let mut iter = slots.into_iter().flatten();
            let mut acc = iter.next().unwrap_or_default();
            for (i, s) in iter.enumerate() {
                if s.len() != acc.len() {
                    return Err(CollectiveError::Mismatch(format!("rank {} passed {} values, rank 0 {}", i + 1, s.len(), acc.len())));
                }
                for (a, b) in acc.iter_mut().zip(&s) {
                    *a += b;
                }
            }
            if op == ReduceOp::Mean {
                let k = n as f32;
                acc.iter_mut().for_each(|a| *a /= k);
            }
            Ok(acc)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: u32) -> (Arc<Collective>, watch::Sender<StopLevel>) {
        let (tx, rx) = watch::channel(StopLevel::Run);
        (Arc::new(Collective::new(n, rx)), tx)
    }

    #[test]
    fn all_reduce_broadcast_and_barrier_across_threads() {
        let (c, _stop) = group(4);
        let handles: Vec<_> = (0..4u32)
            .map(|rank| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for round in 0..50 {
                        let mut v = vec![rank as f32 + round as f32, 1.0];
                        c.all_reduce(rank, &mut v, ReduceOp::Sum).unwrap();
                        out.push(v.clone());
                        let mut m = vec![rank as f32];
                        c.all_reduce(rank, &mut m, ReduceOp::Mean).unwrap();
                        assert_eq!(m, [1.5]);
                        let mut b = vec![rank as f32; 3];
                        c.broadcast(rank, &mut b, 2).unwrap();
                        assert_eq!(b, [2.0; 3]);
                        c.barrier(rank).unwrap();
                    }
                    out
                })
            })
            .collect();
        for h in handles {
            let out = h.join().unwrap();
            for (round, v) in out.iter().enumerate() {
                assert_eq!(v, &[6.0 + 4.0 * round as f32, 4.0]);
            }
        }
    }

    #[test]
    fn an_ended_rank_or_a_stop_unblocks_the_others() {
        let (c, stop) = group(2);
        let c2 = Arc::clone(&c);
        let waiter = std::thread::spawn(move || c2.barrier(0));
        std::thread::sleep(Duration::from_millis(20));
        c.abort("rank 1 failed: boom".into());
        assert_eq!(waiter.join().unwrap(), Err(CollectiveError::Aborted("rank 1 failed: boom".into())));

        let (c, _) = group(2);
        let mut a = vec![1.0];
        let c2 = Arc::clone(&c);
        let t = std::thread::spawn(move || c2.all_reduce(1, &mut [1.0, 2.0], ReduceOp::Sum));
        std::thread::sleep(Duration::from_millis(20));
        assert!(matches!(c.all_reduce(0, &mut a, ReduceOp::Sum), Err(CollectiveError::Mismatch(_))));
        assert!(matches!(t.join().unwrap(), Err(CollectiveError::Mismatch(_))));

        let (c3, stop3) = group(2);
        let t = std::thread::spawn(move || c3.barrier(1));
        std::thread::sleep(Duration::from_millis(20));
        stop3.send(StopLevel::Graceful).unwrap();
        assert_eq!(t.join().unwrap(), Err(CollectiveError::Aborted("the trial was stopped".into())));
        drop(stop);
    }
}
