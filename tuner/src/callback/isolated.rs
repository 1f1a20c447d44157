//! Callbacks that run on threads of their own, so that none can slow the
//! loop, stop the sweep or lose a result.
//!
//! Each callback has a thread and a bounded queue. The loop only queues
//! (never waits): a callback whose queue is full has fallen behind and is
//! cut off. Its thread marks when it took up an event; a callback busy
//! with one event for longer than its deadline is cut off too (its thread
//! is left to finish on its own; the sweep does not wait for it). An error
//! a callback returns is logged and it goes on; a panic cuts it off. At
//! the end each callback gets `close`, and the sweep waits for it at most
//! its deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Callback, Event};

/// Events a callback may lag behind before it is cut off.
pub(crate) const QUEUE: usize = 1 << 16;

/// Errors of one callback logged in full; after that, one line every so many.
const ERRORS_IN_FULL: u64 = 3;
const ERRORS_EVERY: u64 = 1000;

enum Msg {
    Event(Arc<Event>),
    Close,
}

struct Running {
    name: String,
    tx: SyncSender<Msg>,
    /// Milliseconds since `epoch` when it took up its current event; 0 when idle.
    busy_since: Arc<AtomicU64>,
    /// Answers once its thread has ended.
    done: Receiver<()>,
}

/// The callbacks of a sweep that run on their own threads.
pub(crate) struct Isolated {
    running: Vec<Running>,
    deadline: Duration,
    epoch: Instant,
}

impl Isolated {
    /// Starts a thread for each callback; each gets `deadline` for one event, and for its close.
    pub(crate) fn start(callbacks: Vec<Box<dyn Callback>>, deadline: Duration) -> Self {
        let epoch = Instant::now();
        let mut running = Vec::new();
        for cb in callbacks {
            let name = cb.name();
            let (tx, rx) = sync_channel(QUEUE);
            let (done_tx, done) = sync_channel(1);
            let busy_since = Arc::new(AtomicU64::new(0));
            let busy = Arc::clone(&busy_since);
            let thread_name = format!("nestor-cb-{}", name.chars().filter(char::is_ascii_alphanumeric).take(20).collect::<String>());
            let label = name.clone();
            let spawned = std::thread::Builder::new().name(thread_name).spawn(move || {
                serve(cb, &label, &rx, &busy, epoch);
                let _ = done_tx.send(());
            });
            match spawned {
                Ok(_) => running.push(Running { name, tx, busy_since, done }),
                Err(e) => tracing::error!(callback = %name, error = %e, "cannot start a thread for a callback; it gets no events"),
            }
        }
        Self { running, deadline, epoch }
    }

    /// Whether no callback runs.
    pub(crate) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Queues `event` for every callback, never waiting; cuts off those
    /// fallen too far behind, hung past their deadline, or gone.
    pub(crate) fn send(&mut self, event: &Arc<Event>) {
        let now = self.epoch.elapsed().as_millis() as u64;
        let deadline = self.deadline.as_millis() as u64;
        self.running.retain(|r| {
            let since = r.busy_since.load(Ordering::Acquire);
            if since != 0 && now.saturating_sub(since) > deadline {
                tracing::warn!(
                    callback = %r.name,
                    "callback {} has been busy with one event for over {:.0} s: cut off, the sweep goes on",
                    r.name,
                    deadline as f64 / 1000.0
                );
                return false;
            }
            match r.tx.try_send(Msg::Event(Arc::clone(event))) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    tracing::warn!(callback = %r.name, "callback {} fell {QUEUE} events behind: cut off, the sweep goes on", r.name);
                    false
                }
                // It panicked (logged by its thread).
                Err(TrySendError::Disconnected(_)) => false,
            }
        });
    }

    /// Closes every callback: each gets what is queued, then `close`, and
    /// is waited for at most the deadline (all of them at once).
    pub(crate) fn close(self) {
        let until = Instant::now() + self.deadline;
        for r in &self.running {
            // A full queue: it is behind; it gets no close, and is not waited for long.
            let _ = r.tx.try_send(Msg::Close);
        }
        for r in self.running {
            let left = until.saturating_duration_since(Instant::now());
            if r.done.recv_timeout(left).is_err() && r.busy_since.load(Ordering::Acquire) != 0 {
                tracing::warn!(callback = %r.name, "callback {} did not finish within {:?} of the sweep's end; left behind", r.name, self.deadline);
            }
        }
    }
}

/// A callback's thread: events until the queue closes or `Close` comes.
fn serve(mut cb: Box<dyn Callback>, name: &str, rx: &Receiver<Msg>, busy: &AtomicU64, epoch: Instant) {
    let mut errors = 0u64;
    let mut log = |what: &str, e: &dyn std::fmt::Display| {
        errors += 1;
        if errors <= ERRORS_IN_FULL || errors.is_multiple_of(ERRORS_EVERY) {
            tracing::warn!(callback = %name, "callback {name} failed on {what} ({errors} failure(s) so far): {e}");
        }
    };
    while let Ok(msg) = rx.recv() {
        busy.store((epoch.elapsed().as_millis() as u64).max(1), Ordering::Release);
        let (what, outcome) = match &msg {
            Msg::Event(ev) => (ev.kind(), std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb.on_event(ev)))),
            Msg::Close => ("close", std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb.close()))),
        };
        busy.store(0, Ordering::Release);
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log(what, &e),
            Err(panic) => {
                let why = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
                tracing::error!(callback = %name, "callback {name} panicked on {what}: {}; cut off, the sweep goes on", why.unwrap_or_default());
                return;
            }
        }
        if matches!(msg, Msg::Close) {
            return;
        }
    }
    // The sweep dropped the queue without a close (the callback was cut off).
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callback::CallbackError;
    use std::sync::Mutex;

    struct Recorder {
        seen: Arc<Mutex<Vec<&'static str>>>,
        fail: bool,
        hang: Option<Duration>,
    }

    impl Callback for Recorder {
        fn on_event(&mut self, event: &Event) -> Result<(), CallbackError> {
            if let Some(d) = self.hang {
                std::thread::sleep(d);
            }
            self.seen.lock().unwrap().push(event.kind());
            if self.fail {
                return Err("the server is gone".into());
            }
            Ok(())
        }
        fn close(&mut self) -> Result<(), CallbackError> {
            self.seen.lock().unwrap().push("closed");
            Ok(())
        }
    }

    fn msg(n: usize) -> Arc<Event> {
        Arc::new(Event::Message(format!("m{n}")))
    }

    #[test]
    fn every_event_reaches_each_callback_in_order_then_close() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let failing = Arc::new(Mutex::new(Vec::new()));
        let mut iso = Isolated::start(
            vec![
                Box::new(Recorder { seen: seen.clone(), fail: false, hang: None }),
                Box::new(Recorder { seen: failing.clone(), fail: true, hang: None }),
            ],
            Duration::from_secs(5),
        );
        for n in 0..100 {
            iso.send(&msg(n));
        }
        iso.close();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 101);
        assert_eq!(seen.last(), Some(&"closed"));
        // A failing callback is not cut off: it gets every event.
        assert_eq!(failing.lock().unwrap().len(), 101);
    }

    #[test]
    fn a_hung_callback_is_cut_off_and_the_others_go_on() {
        let hung = Arc::new(Mutex::new(Vec::new()));
        let fine = Arc::new(Mutex::new(Vec::new()));
        let mut iso = Isolated::start(
            vec![
                Box::new(Recorder { seen: hung.clone(), fail: false, hang: Some(Duration::from_secs(3)) }),
                Box::new(Recorder { seen: fine.clone(), fail: false, hang: None }),
            ],
            Duration::from_millis(200),
        );
        iso.send(&msg(0));
        std::thread::sleep(Duration::from_millis(400));
        let start = Instant::now();
        for n in 1..10 {
            iso.send(&msg(n));
        }
        assert_eq!(iso.running.len(), 1, "the hung callback is cut off");
        iso.close();
        assert!(start.elapsed() < Duration::from_secs(2), "the end does not wait for a hung callback");
        assert_eq!(fine.lock().unwrap().len(), 11);
    }

    #[test]
    fn a_panicking_callback_is_cut_off() {
        let mut iso = Isolated::start(vec![Box::new(|_: &Event| panic!("boom"))], Duration::from_secs(5));
        let start = Instant::now();
        let mut n = 0;
        // Its thread ends once the panic is logged (a backtrace can take a while).
        while !iso.is_empty() && start.elapsed() < Duration::from_secs(20) {
            iso.send(&msg(n));
            n += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(iso.is_empty(), "cut off");
        iso.close();
    }
}
