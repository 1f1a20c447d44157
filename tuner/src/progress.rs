//! What a person sees while a sweep runs: a live table on a terminal,
//! plain lines otherwise. Written to stderr, so stdout stays for results.
//! A consumer of the sweep's events like any other.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::time::Instant;

use schedulers::TrialStatus;

use crate::callback::{Callback, CallbackError, Event, RunningTrial, Status};
use crate::config::ProgressMode;
use crate::echo::{Drawn, Echo};
use crate::store::TrialRecord;
use crate::text::{config_summary, fmt_num, headline};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Live,
    Plain,
    Quiet,
}

pub(crate) struct Progress {
    style: Style,
    metric: Option<String>,
    start: Instant,
    terminated: usize,
    errored: usize,
    /// The lines the live table occupies (shared with the ranks' echo, which clears it to write).
    drawn: Drawn,
    recent: VecDeque<String>,
    /// The ranks' output, shown as it comes (`log_to_driver`), with the experiment's directory.
    echo: Option<(Echo, std::path::PathBuf)>,
    /// When plain output last printed a status line.
    last_plain_status: Option<Instant>,
}

impl Progress {
    pub(crate) fn new(mode: ProgressMode, metric: Option<String>) -> Self {
        let style = match mode {
            ProgressMode::Quiet => Style::Quiet,
            ProgressMode::Plain => Style::Plain,
            ProgressMode::Auto if std::io::stderr().is_terminal() => Style::Live,
            ProgressMode::Auto => Style::Plain,
        };
        Self {
            style,
            metric,
            start: Instant::now(),
            terminated: 0,
            errored: 0,
            drawn: Drawn::default(),
            recent: VecDeque::new(),
            echo: None,
            last_plain_status: None,
        }
    }

    /// Shows each rank's output of the trials of the experiment in
    /// `exp_dir` as it comes (not when quiet).
    pub(crate) fn echo_ranks(&mut self, exp_dir: std::path::PathBuf) {
        if self.style == Style::Quiet {
            return;
        }
        match Echo::start(std::sync::Arc::clone(&self.drawn)) {
            Ok(echo) => self.echo = Some((echo, exp_dir)),
            Err(e) => tracing::warn!(error = %e, "the ranks' output cannot be shown on the console"),
        }
    }

    fn follow(&self, r: &TrialRecord) {
        if let Some((echo, exp_dir)) = &self.echo {
            let nodes: Vec<String> = r.resources.iter().map(|b| b.node.clone()).collect();
            let first_run = r.num_results == 0
                && r.restarts == 0
                && r.resumes == 0
                && r.failures == 0
                && r.infrastructure_failures == 0
                && r.exploits == 0
                && r.resizes == 0;
            echo.follow(&r.id, &exp_dir.join("trials").join(&r.id), &nodes, first_run);
        }
    }

    fn metric_text(&self, metrics: Option<&serde_json::Value>) -> String {
        match (&self.metric, metrics) {
            (Some(m), Some(v)) => v.get(m).and_then(serde_json::Value::as_f64).map(|x| format!("{m}={}", fmt_num(x))).unwrap_or_default(),
            _ => String::new(),
        }
    }

    fn row(&self, id: &str, status: &str, iter: u64, metrics: Option<&serde_json::Value>, config: &serde_json::Value) -> String {
        format!("{id:<12} {status:<10} iter={iter:<4} {:<22} {}", self.metric_text(metrics), config_summary(config))
    }

    fn line(&self, r: &TrialRecord) -> String {
        let iter = r.last_result.as_ref().map_or(0, |l| l.training_iteration);
        let metrics = r.last_result.as_ref().map(|l| search::metrics_serde::to_json(&l.metrics));
        self.row(&r.id, r.status.as_str(), iter, metrics.as_ref(), &r.config)
    }

    pub(crate) fn trial_started(&mut self, r: &TrialRecord) {
        self.follow(r);
        if self.style == Style::Plain {
            eprintln!("{:<12} RUNNING    {}", r.id, config_summary(&r.config));
        }
    }

    pub(crate) fn trial_ended(&mut self, r: &TrialRecord) {
        if let Some((echo, _)) = &self.echo {
            echo.finish(&r.id);
        }
        match r.status {
            TrialStatus::Terminated => self.terminated += 1,
            TrialStatus::Error => self.errored += 1,
            _ => {}
        }
        if self.style == Style::Quiet {
            return;
        }
        let mut line = self.line(r);
        if let Some(e) = &r.error {
            line.push_str(&format!("\n    error: {}", headline(e)));
        }
        match self.style {
            Style::Plain => eprintln!("{line}"),
            Style::Live => {
                self.recent.push_back(line);
                while self.recent.len() > 6 {
                    self.recent.pop_front();
                }
            }
            Style::Quiet => {}
        }
    }

    pub(crate) fn note(&mut self, text: &str) {
        if self.style != Style::Quiet {
            self.clear();
            eprintln!("{text}");
        }
    }

    fn clear(&mut self) {
        let mut drawn = self.drawn.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.style == Style::Live && *drawn > 0 {
            eprint!("\x1b[{}A\x1b[J", *drawn);
            *drawn = 0;
        }
    }

    /// `3 running, 12/64 done (11 terminated, 1 errored), 49 pending | best loss=0.12 (trial_00004) | 12.3s, ETA 1m20s`
    fn summary(&self, s: &Status) -> String {
        let mut out =
            format!("{} running, {}/{} done ({} terminated, {} errored)", s.running.len(), s.done(), s.planned, s.terminated, s.error);
        if s.paused > 0 {
            out.push_str(&format!(", {} paused", s.paused));
        }
        out.push_str(&format!(", {} pending", s.pending));
        if let (Some(b), Some(m)) = (&s.best, &s.metric) {
            out.push_str(&format!(" | best {m}={} ({})", fmt_num(b.value), b.trial_id));
        }
        out.push_str(&format!(" | {}", duration(s.elapsed_s)));
        if let Some(eta) = s.eta_s {
            out.push_str(&format!(", ETA {}", duration(eta)));
        }
        out
    }

    pub(crate) fn refresh(&mut self, status: &Status) {
        match self.style {
            Style::Quiet => return,
            Style::Plain => {
                // A line now and then, for logs.
                if self.last_plain_status.is_none_or(|t| t.elapsed().as_secs() >= PLAIN_STATUS_EVERY_S) {
                    if self.last_plain_status.is_some() {
                        eprintln!("== {} ==", self.summary(status));
                    }
                    self.last_plain_status = Some(Instant::now());
                }
                return;
            }
            Style::Live => {}
        }
        let rows: &[RunningTrial] = &status.running;
        let mut out = vec![format!("== nestor: {} ==", self.summary(status))];
        for r in rows.iter().take(16) {
            out.push(self.row(&r.trial_id, "RUNNING", r.iteration, r.metrics.as_ref(), &r.config));
        }
        if rows.len() > 16 {
            out.push(format!("... and {} more running", rows.len() - 16));
        }
        out.extend(self.recent.iter().flat_map(|l| l.lines().map(String::from)));
        let mut drawn = self.drawn.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut err = std::io::stderr().lock();
        if *drawn > 0 {
            let _ = write!(err, "\x1b[{}A\x1b[J", *drawn);
        }
        for l in &out {
            let _ = writeln!(err, "{l}");
        }
        *drawn = out.len();
    }

    pub(crate) fn finish(&mut self) {
        if let Some((mut echo, _)) = self.echo.take() {
            echo.close();
        }
        self.clear();
        if self.style != Style::Quiet {
            eprintln!(
                "Sweep finished in {:.1}s: {} terminated, {} errored",
                self.start.elapsed().as_secs_f64(),
                self.terminated,
                self.errored
            );
        }
    }
}

/// Seconds between status lines when the output is not a terminal.
const PLAIN_STATUS_EVERY_S: u64 = 30;

/// `42s`, `3m05s`, `2h07m`.
pub(crate) fn duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl Callback for Progress {
    fn on_event(&mut self, event: &Event) -> Result<(), CallbackError> {
        match event {
            Event::TrialStarted { trial, .. } => self.trial_started(trial),
            Event::TrialCompleted(r) | Event::TrialErrored(r) | Event::TrialPaused(r) | Event::TrialInterrupted(r) => self.trial_ended(r),
            Event::TrialRestarted { .. }
            | Event::Exploited(_)
            | Event::Resized { .. }
            | Event::NodeSetAside { .. }
            | Event::Stopping { .. }
            | Event::Message(_) => self.note(&event.to_string()),
            Event::Status(s) => self.refresh(s),
            Event::ExperimentEnded(_) => self.finish(),
            _ => {}
        }
        Ok(())
    }

    fn name(&self) -> String {
        "console".into()
    }
}

#[cfg(test)]
mod tests {
    use super::duration;

    #[test]
    fn durations_are_short() {
        assert_eq!(duration(42.4), "42s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(7620.0), "2h07m");
        assert_eq!(duration(-1.0), "0s");
    }
}
