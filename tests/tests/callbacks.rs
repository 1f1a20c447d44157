//! Callbacks through `Tuner::callback`: every event in order for one that
//! behaves; a failing one and a hanging one do not hurt the sweep, lose a
//! result or keep it waiting past their deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tuner::callback::{Callback, CallbackError, Event};
use tuner::{Domain, Mode, ProgressMode, RunConfig, Space, Trainable, TuneConfig, Tuner};

struct Failing;
impl Callback for Failing {
    fn on_event(&mut self, _: &Event) -> Result<(), CallbackError> {
        Err("the tracking server is gone".into())
    }
}

/// Hangs on the first result, for good.
struct Hanging;
impl Callback for Hanging {
    fn on_event(&mut self, e: &Event) -> Result<(), CallbackError> {
        if matches!(e, Event::Result(_)) {
            std::thread::sleep(Duration::from_secs(3600));
        }
        Ok(())
    }
}

#[test]
fn a_failing_and_a_hanging_callback_do_not_hurt_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let space = Space::builder().param("x", Domain::uniform(0.0, 1.0)).build().unwrap();
    let trainable = Trainable::function(|ctx| {
        let x: f64 = ctx.param("x")?;
        for i in 1..=20 {
            std::thread::sleep(Duration::from_millis(20));
            ctx.report([("loss", x / i as f64)], None)?;
        }
        Ok(())
    });
    let seen: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let log = Arc::clone(&seen);
    let start = Instant::now();
    let grid = Tuner::new(trainable, space)
        .tune_config(TuneConfig { metric: Some("loss".into()), mode: Some(Mode::Min), num_samples: 6, seed: Some(1), ..Default::default() })
        .run_config(RunConfig { name: "cb".into(), storage: dir.path().to_path_buf(), progress: ProgressMode::Quiet, ..Default::default() })
        .callback(Failing)
        .callback(Hanging)
        .callback(move |e: &Event| log.lock().unwrap().push(e.kind()))
        .callback_deadline(Duration::from_secs(1))
        .fit()
        .unwrap();
    let took = start.elapsed();
    assert_eq!(grid.num_terminated(), 6);
    assert!(grid.iter().all(|t| t.history.len() == 20), "every result is stored");
    assert!(took < Duration::from_secs(30), "the end did not wait for the hung callback: {took:?}");
    // The well-behaved callback saw the whole sweep, in order.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.first(), Some(&"experiment_started"));
    assert_eq!(seen.last(), Some(&"experiment_ended"));
    assert_eq!(seen.iter().filter(|k| **k == "result").count(), 120);
    assert_eq!(seen.iter().filter(|k| **k == "trial_started").count(), 6);
    assert_eq!(seen.iter().filter(|k| **k == "trial_completed").count(), 6);
}
