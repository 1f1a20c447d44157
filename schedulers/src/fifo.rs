//! FIFO: run trials in creation order, never stop one early.

use search::TrialResult;

use crate::scheduler::{Decision, Scheduler, TrialView};

/// First in, first out; every result gets [`Decision::Continue`]. Trials end
/// when their trainable returns or a stopper fires.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fifo;

impl Scheduler for Fifo {
    fn on_trial_result(&mut self, _trial: &TrialView<'_>, _result: &TrialResult) -> Decision {
        Decision::Continue
    }

    fn decides_on_results(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TrialStatus;

    #[test]
    fn fifo_continues_and_runs_oldest_first() {
        let c = serde_json::json!({});
        let v = |id| TrialView { id, config: &c, status: TrialStatus::Pending, num_results: 0, num_workers: 1 };
        let r =
            TrialResult { extra: None, trial_id: "a".into(), seq: 0, training_iteration: 1, metrics: Default::default(), checkpoint: None };
        assert_eq!(Fifo.on_trial_result(&v("a"), &r), Decision::Continue);
        assert!(!Fifo.decides_on_results(), "nothing but Continue: reports need no answer");
        // New trials first; then the paused ones, oldest first.
        assert_eq!(Fifo.choose_trial_to_run(&[v("a"), v("b")], true), None);
        assert_eq!(Fifo.choose_trial_to_run(&[v("a"), v("b")], false).as_deref(), Some("a"));
        assert_eq!(Fifo.choose_trial_to_run(&Vec::new(), false), None);
    }
}
