//! The ranks' output on the driver's console, as Ray shows its workers':
//! each line a rank writes, behind `(trial_00003 rank 1)` (and `, node n2`
//! when the trial's ranks are on named nodes). A thread of its own follows
//! the rank logs of the running trials (`trials/<id>/logs/rank-<r>.log`,
//! which every engine writes, on this machine or relayed from the nodes)
//! and writes their complete lines to stderr in batches; the loop only
//! tells it which trials to follow, and never waits on it or on a file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the followed logs are read.
const POLL: Duration = Duration::from_millis(100);
/// A line longer than this is shown in pieces (a progress bar that never ends its line).
const MAX_LINE: usize = 64 * 1024;
/// How long the close waits for the last lines of the trials that ended.
const CLOSE_DEADLINE: Duration = Duration::from_secs(2);

/// The lines the live table occupies at the bottom of the terminal: what
/// must be cleared before other lines are written (0: nothing drawn).
pub(crate) type Drawn = Arc<Mutex<usize>>;

/// One rank's log, followed.
struct Followed {
    prefix: String,
    path: PathBuf,
    file: Option<File>,
    /// Where the next read starts.
    offset: u64,
    /// The start of a line not yet ended.
    partial: Vec<u8>,
}

enum Command {
    /// Follow these ranks' logs (rank, node, path), from `from_start` or from their current end.
    Follow { trial: String, ranks: Vec<(u32, String, PathBuf)>, from_start: bool },
    /// The trial's run ended: show the rest of its logs, then stop following them.
    Finish { trial: String },
}

/// The follower: a thread and the channel that tells it what to follow.
pub(crate) struct Echo {
    tx: Option<Sender<Command>>,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    /// Starts the follower; its lines go to stderr, after clearing what the live table `drawn` occupies.
    pub(crate) fn start(drawn: Drawn) -> std::io::Result<Self> {
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new().name("nestor-echo".into()).spawn(move || follow(&rx, &drawn))?;
        Ok(Self { tx: Some(tx), thread: Some(thread) })
    }

    /// Follows the rank logs of `trial` (its directory `trial_dir`, its
    /// ranks on `nodes`, one per rank, empty names on a one-node pool).
    /// A first run is shown from the start of its logs; a later run
    /// (restart, resume) from where they end now.
    pub(crate) fn follow(&self, trial: &str, trial_dir: &std::path::Path, nodes: &[String], first_run: bool) {
        let logs = trial_dir.join("logs");
        let ranks = nodes.iter().enumerate().map(|(r, node)| (r as u32, node.clone(), logs.join(format!("rank-{r}.log")))).collect();
        self.send(Command::Follow { trial: trial.to_string(), ranks, from_start: first_run });
    }

    /// The run of `trial` ended: its last lines are shown, then its logs are let go.
    pub(crate) fn finish(&self, trial: &str) {
        self.send(Command::Finish { trial: trial.to_string() });
    }

    fn send(&self, c: Command) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(c);
        }
    }

    /// Shows what is left and stops the thread, waiting for it at most a moment.
    pub(crate) fn close(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let deadline = Instant::now() + CLOSE_DEADLINE;
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.close();
    }
}

fn prefix(trial: &str, rank: u32, node: &str) -> String {
    if node.is_empty() {
        format!("({trial} rank {rank}) ")
    } else {
        format!("({trial} rank {rank}, node {node}) ")
    }
}

/// The thread: reads every followed log each `POLL`, and at once when told a trial ended.
fn follow(rx: &Receiver<Command>, drawn: &Drawn) {
    let mut trials: BTreeMap<String, Vec<Followed>> = BTreeMap::new();
    let mut out = Vec::new();
    let mut open = true;
    while open || !trials.is_empty() {
        let mut finished = Vec::new();
        match rx.recv_timeout(POLL) {
            Ok(Command::Follow { trial, ranks, from_start }) => {
                let followed = ranks
                    .into_iter()
                    .map(|(rank, node, path)| {
                        let offset = if from_start { 0 } else { std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) };
                        Followed { prefix: prefix(&trial, rank, &node), path, file: None, offset, partial: Vec::new() }
                    })
                    .collect();
                trials.insert(trial, followed);
            }
            Ok(Command::Finish { trial }) => finished.push(trial),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                // The sweep ends: the last lines of every trial still followed.
                open = false;
                finished.extend(trials.keys().cloned());
            }
        }
        for ranks in trials.values_mut() {
            for f in ranks.iter_mut() {
                read_lines(f, &mut out, false);
            }
        }
        for trial in finished {
            if let Some(mut ranks) = trials.remove(&trial) {
                for f in &mut ranks {
                    read_lines(f, &mut out, true);
                }
            }
        }
        if !out.is_empty() {
            write_out(&out, drawn);
            out.clear();
        }
    }
}

/// Appends the complete lines `f` holds now to `out`, each behind its
/// prefix; with `last`, its unfinished line too.
fn read_lines(f: &mut Followed, out: &mut Vec<u8>, last: bool) {
    if f.file.is_none() {
        let Ok(mut file) = File::open(&f.path) else { return };
        if file.seek(SeekFrom::Start(f.offset)).is_err() {
            return;
        }
        f.file = Some(file);
    }
    let Some(file) = f.file.as_mut() else { return };
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        f.offset += n as u64;
        let mut rest = &buf[..n];
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            f.partial.extend_from_slice(&rest[..end]);
            emit(&f.prefix, &f.partial, out);
            f.partial.clear();
            rest = &rest[end + 1..];
        }
        f.partial.extend_from_slice(rest);
        if f.partial.len() >= MAX_LINE {
            emit(&f.prefix, &f.partial, out);
            f.partial.clear();
        }
    }
    if last && !f.partial.is_empty() {
        emit(&f.prefix, &f.partial, out);
        f.partial.clear();
    }
}

/// One line behind its prefix; of a line a progress bar rewrote with
/// carriage returns, what a terminal would show (the text after the last).
fn emit(prefix: &str, line: &[u8], out: &mut Vec<u8>) {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let shown = match line.iter().rposition(|&b| b == b'\r') {
        Some(at) => &line[at + 1..],
        None => line,
    };
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(shown);
    out.push(b'\n');
}

fn write_out(out: &[u8], drawn: &Drawn) {
    let mut drawn = drawn.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut err = std::io::stderr().lock();
    if *drawn > 0 {
        // The live table goes; it is drawn again, below these lines, at its next refresh.
        let _ = write!(err, "\x1b[{}A\x1b[J", *drawn);
        *drawn = 0;
    }
    let _ = err.write_all(out);
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn followed(path: PathBuf, offset: u64) -> Followed {
        Followed { prefix: prefix("trial_00003", 1, ""), path, file: None, offset, partial: Vec::new() }
    }

    #[test]
    fn complete_lines_are_shown_behind_their_prefix_and_a_partial_one_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rank-1.log");
        std::fs::write(&path, "epoch 1\nepoch 2\nhalf").unwrap();
        let mut f = followed(path.clone(), 0);
        let mut out = Vec::new();
        read_lines(&mut f, &mut out, false);
        assert_eq!(String::from_utf8(out.clone()).unwrap(), "(trial_00003 rank 1) epoch 1\n(trial_00003 rank 1) epoch 2\n");
        out.clear();
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b" a line\nlast").unwrap();
        read_lines(&mut f, &mut out, false);
        assert_eq!(String::from_utf8(out.clone()).unwrap(), "(trial_00003 rank 1) half a line\n");
        out.clear();
        read_lines(&mut f, &mut out, true);
        assert_eq!(String::from_utf8(out).unwrap(), "(trial_00003 rank 1) last\n", "the unfinished line at the run's end");
    }

    #[test]
    fn a_later_run_is_shown_from_where_its_log_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rank-1.log");
        std::fs::write(&path, "the first run\n").unwrap();
        let mut f = followed(path.clone(), std::fs::metadata(&path).unwrap().len());
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"the second run\n").unwrap();
        let mut out = Vec::new();
        read_lines(&mut f, &mut out, true);
        assert_eq!(String::from_utf8(out).unwrap(), "(trial_00003 rank 1) the second run\n");
    }

    #[test]
    fn a_progress_bar_shows_its_last_state_and_a_node_is_named() {
        let mut out = Vec::new();
        emit(&prefix("trial_00000", 0, "n2"), b" 10%\r 50%\r100%\r", &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), "(trial_00000 rank 0, node n2) 100%\n");
    }

    #[test]
    fn an_endless_line_is_shown_in_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rank-1.log");
        std::fs::write(&path, vec![b'x'; MAX_LINE * 2 + 10]).unwrap();
        let mut f = followed(path, 0);
        let mut out = Vec::new();
        read_lines(&mut f, &mut out, false);
        assert!(String::from_utf8(out).unwrap().lines().count() >= 1);
        assert!(f.partial.len() < MAX_LINE, "what is held stays bounded");
    }

    #[test]
    fn the_follower_shows_a_finished_trials_lines_before_it_closes() {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        std::fs::write(logs.join("rank-0.log"), "hello from rank 0\n").unwrap();
        let drawn: Drawn = Arc::new(Mutex::new(0));
        let mut echo = Echo::start(Arc::clone(&drawn)).unwrap();
        echo.follow("trial_00000", dir.path(), &[String::new()], true);
        echo.finish("trial_00000");
        echo.close();
        assert!(echo.thread.is_none(), "the thread ended within the close's deadline");
    }
}
