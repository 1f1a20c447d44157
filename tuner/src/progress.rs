//! What a person sees while a sweep runs: a live table on a terminal,
//! plain lines otherwise. Written to stderr, so stdout stays for results.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::time::Instant;

use schedulers::TrialStatus;

use crate::config::ProgressMode;
use crate::store::TrialRecord;

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
    drawn: usize,
    recent: VecDeque<String>,
}

/// `lr=0.001 model.width=64`, shortened.
pub(crate) fn config_summary(config: &serde_json::Value) -> String {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&p, v, out);
                }
            }
            serde_json::Value::Number(n) => out.push(format!("{prefix}={}", fmt_num(n.as_f64().unwrap_or(f64::NAN)))),
            other => out.push(format!("{prefix}={other}")),
        }
    }
    let mut out = Vec::new();
    walk("", config, &mut out);
    out.join(" ")
}

/// Four significant digits, no noise.
pub(crate) fn fmt_num(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e9 {
        return format!("{x}");
    }
    if x != 0.0 && (x.abs() < 1e-3 || x.abs() >= 1e6) {
        return format!("{x:.3e}");
    }
    let s = format!("{x:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl Progress {
    pub(crate) fn new(mode: ProgressMode, metric: Option<String>) -> Self {
        let style = match mode {
            ProgressMode::Quiet => Style::Quiet,
            ProgressMode::Plain => Style::Plain,
            ProgressMode::Auto if std::io::stderr().is_terminal() => Style::Live,
            ProgressMode::Auto => Style::Plain,
        };
        Self { style, metric, start: Instant::now(), terminated: 0, errored: 0, drawn: 0, recent: VecDeque::new() }
    }

    fn metric_text(&self, r: &TrialRecord) -> String {
        let Some(last) = &r.last_result else { return String::new() };
        match &self.metric {
            Some(m) => last.metrics.get(m).map(|v| format!("{m}={}", fmt_num(*v))).unwrap_or_default(),
            None => String::new(),
        }
    }

    fn line(&self, r: &TrialRecord) -> String {
        let iter = r.last_result.as_ref().map_or(0, |l| l.training_iteration);
        format!("{:<12} {:<10} iter={:<4} {:<22} {}", r.id, r.status.as_str(), iter, self.metric_text(r), config_summary(&r.config))
    }

    pub(crate) fn trial_started(&mut self, r: &TrialRecord) {
        if self.style == Style::Plain {
            eprintln!("{:<12} RUNNING    {}", r.id, config_summary(&r.config));
        }
    }

    pub(crate) fn trial_ended(&mut self, r: &TrialRecord) {
        match r.status {
            TrialStatus::Terminated => self.terminated += 1,
            TrialStatus::Error => self.errored += 1,
            _ => {}
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
        if self.style == Style::Live && self.drawn > 0 {
            eprint!("\x1b[{}A\x1b[J", self.drawn);
            self.drawn = 0;
        }
    }

    pub(crate) fn refresh<'a>(&mut self, running: impl Iterator<Item = &'a TrialRecord>) {
        if self.style != Style::Live {
            return;
        }
        let mut rows: Vec<&TrialRecord> = running.collect();
        rows.sort_by_key(|r| r.index);
        let mut out = Vec::new();
        out.push(format!(
            "== nestor: {} running, {} terminated, {} error | {:.1}s ==",
            rows.len(),
            self.terminated,
            self.errored,
            self.start.elapsed().as_secs_f64()
        ));
        for r in rows.iter().take(16) {
            out.push(self.line(r));
        }
        if rows.len() > 16 {
            out.push(format!("... and {} more running", rows.len() - 16));
        }
        out.extend(self.recent.iter().flat_map(|l| l.lines().map(String::from)));
        self.clear();
        let mut err = std::io::stderr().lock();
        for l in &out {
            let _ = writeln!(err, "{l}");
        }
        self.drawn = out.len();
    }

    pub(crate) fn finish(&mut self) {
        self.clear();
        if self.style != Style::Quiet {
            eprintln!(
                "Sweep finished in {:.1}s: {} terminated, {} error",
                self.start.elapsed().as_secs_f64(),
                self.terminated,
                self.errored
            );
        }
    }
}

/// A trial's error or failure in one line: its first line, with a log tail's
/// header shortened to where the log is (`...; log: .../rank-0.log`).
pub(crate) fn headline(message: &str) -> String {
    let first = message.lines().next().unwrap_or_default();
    match first.split_once("; last log lines (") {
        Some((what, rest)) => format!("{what}; log: {}", rest.trim_end_matches(':').trim_end_matches(')')),
        None => first.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_headline_is_one_line_with_the_log_named() {
        let msg = "rank 1 exited with code 3; last log lines (/x/logs/rank-1.log):\nTraceback\nValueError: boom";
        assert_eq!(headline(msg), "rank 1 exited with code 3; log: /x/logs/rank-1.log");
        assert_eq!(headline("trial reported no `loss`"), "trial reported no `loss`");
        assert_eq!(headline(""), "");
    }

    #[test]
    fn numbers_and_configs_are_compact() {
        assert_eq!(fmt_num(0.123456), "0.1235");
        assert_eq!(fmt_num(3.0), "3");
        assert_eq!(fmt_num(0.00001234), "1.234e-5");
        let c = serde_json::json!({"lr": 0.001, "model": {"width": 64}, "opt": "adam"});
        assert_eq!(config_summary(&c), "lr=0.001 model.width=64 opt=\"adam\"");
    }
}
