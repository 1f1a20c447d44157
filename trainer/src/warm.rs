//! Warm worker processes: the trainer's command started once (with
//! `NESTOR_ZYGOTE=1`) as a process that loads what every rank needs (the
//! interpreter, its imports, the training function) and then forks each
//! rank on request. A rank is a fresh fork of a process that never ran a
//! trial, so nothing one trial does reaches the next; what it saves is the
//! start-up (hundreds of milliseconds of imports per rank in Python).
//!
//! The protocol is JSON lines on the warm process's stdin and stdout:
//! `{"id": n, "env": {..}, "cwd": "..", "log": ".."}` asks for
//! a rank; `{"id": n, "pid": p}` (or `{"id": n, "error": ".."}`) answers;
//! `{"exited": p, "status": s}` (a raw wait status) tells of a rank's end.
//! Each rank runs in a process group of its own (its pid), dies with the
//! warm process (`PR_SET_PDEATHSIG`), which dies with the driver.
//!
//! A front end that already holds what the ranks need loaded (the Python
//! driver, which imported the training function's modules) may fork the
//! warm process itself and offer it: `NESTOR_WARM_FDS=<requests>,<answers>,<stderr>,<pid>`
//! names the pipes' ends this process inherited, `NESTOR_WARM_FOR` the
//! worker command's last argument it serves. The first pool whose command
//! ends with that argument attaches to it in place of starting one; the
//! process ends when its requests' pipe closes (this process gone), and a
//! pool whose offered process died starts its own as usual.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use crate::groups::describe_exit;

/// A rank to fork: its variables over the warm process's, where it runs and logs.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RankSpec {
    /// Set in the rank.
    pub env: BTreeMap<String, String>,
    /// Its working directory.
    pub cwd: PathBuf,
    /// Its stdout and stderr (appended).
    pub log: PathBuf,
    /// What it runs, when not the warm process's own (a trainer inside a
    /// trial: the worker command's last argument, another pickled function).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
}

/// A forked rank: its pid (and process group) and its exit, to come.
pub(crate) struct Forked {
    pub pid: i32,
    pub exit: oneshot::Receiver<std::io::Result<ExitStatus>>,
}

type ForkReply = oneshot::Sender<Result<Forked, String>>;

struct Request {
    spec: RankSpec,
    reply: ForkReply,
}

#[derive(Serialize)]
struct Wire<'a> {
    id: u64,
    #[serde(flatten)]
    spec: &'a RankSpec,
}

#[derive(Deserialize)]
struct Answer {
    id: Option<u64>,
    pid: Option<i32>,
    error: Option<String>,
    exited: Option<i32>,
    status: Option<i32>,
}

/// The warm process of one backend, started on first use and again after it dies.
#[derive(Default)]
pub(crate) struct WarmPool {
    current: Mutex<Option<WarmQueue>>,
}

impl std::fmt::Debug for WarmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WarmPool")
    }
}

impl WarmPool {
    /// The running warm process's request queue, starting one when none runs.
    /// Call it from the thread that spawns ranks (`PR_SET_PDEATHSIG` follows
    /// the spawning thread).
    /// `command` makes the command it starts (the workers' program, env and
    /// working directory; the pool adds `NESTOR_ZYGOTE=1` and the pipes).
    pub(crate) fn queue(&self, command: impl FnOnce() -> tokio::process::Command) -> Result<WarmQueue, std::io::Error> {
        let mut current = self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(q) = current.as_ref().filter(|q| !q.requests.is_closed()) {
            return Ok(q.clone());
        }
        let command = command();
        let attached = take_offer(&command).and_then(|offer| {
            attach(offer, &command).map_err(|e| tracing::warn!("the offered warm worker process cannot be used ({e}); starting one")).ok()
        });
        let q = match attached {
            Some(q) => q,
            None => start(command)?,
        };
        *current = Some(q.clone());
        Ok(q)
    }
}

/// A warm process the front end forked and handed over (`NESTOR_WARM_FDS`).
struct Offer {
    requests: OwnedFd,
    answers: OwnedFd,
    stderr: OwnedFd,
    pid: i32,
    serves: String,
}

static OFFER: OnceLock<Mutex<Option<Offer>>> = OnceLock::new();

/// Takes the offered warm process's pipes from the environment, once per
/// process, closed on exec (no other child inherits them: the process
/// must hear its requests' end when this one ends). Call it before this
/// process starts any child; later calls do nothing. A malformed offer is
/// logged and left alone: the pools start their own.
pub fn adopt_offered_warm_process() {
    OFFER.get_or_init(|| {
        Mutex::new(offered().unwrap_or_else(|e| {
            tracing::warn!("{e}; the warm worker process is started here instead");
            None
        }))
    });
}

/// The offer the environment names: none without one, or when it is not
/// from the process that started this one (the variables may have reached
/// a process further down, a sweep inside a trial, where the numbers name
/// other files, not to be touched).
fn offered() -> Result<Option<Offer>, String> {
    let Ok(spec) = std::env::var("NESTOR_WARM_FDS") else { return Ok(None) };
    let [requests, answers, stderr, pid] = parse_offer(&spec)?;
    if parent_of(pid) != Some(std::os::unix::process::parent_id() as i32) {
        return Ok(None);
    }
    Ok(Some(Offer {
        requests: take_inherited_fd(requests, "NESTOR_WARM_FDS")?,
        answers: take_inherited_fd(answers, "NESTOR_WARM_FDS")?,
        stderr: take_inherited_fd(stderr, "NESTOR_WARM_FDS")?,
        pid,
        serves: std::env::var("NESTOR_WARM_FOR").unwrap_or_default(),
    }))
}

/// A process's parent, from `/proc/<pid>/stat` (its fourth field, after the name in parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

fn parse_offer(spec: &str) -> Result<[i32; 4], String> {
    let n: Vec<i32> =
        spec.split(',').map(|s| s.trim().parse::<i32>()).collect::<Result<_, _>>().map_err(|e| format!("NESTOR_WARM_FDS={spec}: {e}"))?;
    <[i32; 4]>::try_from(n).map_err(|_| format!("NESTOR_WARM_FDS={spec}: give three file descriptors and a pid"))
}

/// Owns the open file descriptor `fd` this process inherited (named by the
/// variable `var`), closed on exec so that the processes it starts do not
/// inherit it.
pub fn take_inherited_fd(fd: i32, var: &str) -> Result<OwnedFd, String> {
    // SAFETY: fcntl on any integer is defined; it fails with EBADF for a descriptor that is not open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if fd < 3 || flags < 0 {
        return Err(format!("{var}: file descriptor {fd} is not open in this process"));
    }
    // SAFETY: as above; setting FD_CLOEXEC on an open descriptor.
    unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    // SAFETY: the descriptor is open, and the caller takes it once (from a variable read once).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The offered process, when it serves `command` (the same last argument: the pickled function).
fn take_offer(command: &tokio::process::Command) -> Option<Offer> {
    let mut slot = OFFER.get()?.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let last = command.as_std().get_args().last()?.to_str()?;
    if slot.as_ref().is_some_and(|o| o.serves == last) {
        slot.take()
    } else {
        None
    }
}

fn attach(offer: Offer, command: &tokio::process::Command) -> Result<WarmQueue, std::io::Error> {
    use tokio::net::unix::pipe;
    let stdin = pipe::Sender::from_owned_fd(offer.requests)?;
    let stdout = pipe::Receiver::from_owned_fd(offer.answers)?;
    let stderr = pipe::Receiver::from_owned_fd(offer.stderr)?;
    // What the started process would have had over this one's environment, each rank gets.
    let base: BTreeMap<String, String> =
        command.as_std().get_envs().filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string()))).collect();
    let (tx, rx) = mpsc::unbounded_channel();
    let ended = Arc::new(OnceLock::new());
    tracing::debug!("attached to the warm worker process {} the front end forked", offer.pid);
    tokio::spawn(serve(Exit::Offered(offer.pid), stdin, stdout, stderr, rx, Arc::clone(&ended)));
    Ok(WarmQueue { requests: tx, ended, base: Arc::new(base) })
}

/// Where a run asks the warm process for its ranks.
#[derive(Clone)]
pub(crate) struct WarmQueue {
    requests: mpsc::UnboundedSender<Request>,
    /// How the process ended, once it has: what a request that comes too late hears.
    ended: Arc<OnceLock<String>>,
    /// Variables every rank gets under its own (an offered process's: what
    /// the pool's command would have set in a process it started).
    base: Arc<BTreeMap<String, String>>,
}

impl WarmQueue {
    /// Forks one rank.
    pub(crate) async fn fork(&self, mut spec: RankSpec) -> Result<Forked, String> {
        if !self.base.is_empty() {
            let own = std::mem::take(&mut spec.env);
            spec.env = self.base.as_ref().clone();
            spec.env.extend(own);
        }
        let gone = || self.ended.get().cloned().unwrap_or_else(|| "the warm worker process is gone".to_string());
        let (reply, answer) = oneshot::channel();
        self.requests.send(Request { spec, reply }).map_err(|_| gone())?;
        answer.await.unwrap_or_else(|_| Err(gone()))
    }
}

fn start(mut cmd: tokio::process::Command) -> Result<WarmQueue, std::io::Error> {
    cmd.env("NESTOR_ZYGOTE", "1").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take()) else {
        return Err(std::io::Error::other("the warm worker process has no pipes"));
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let ended = Arc::new(OnceLock::new());
    // The task owns the process: it ends when the process does (every
    // waiter then hears why) or when the backend is dropped (the process is
    // killed with it).
    tokio::spawn(serve(Exit::Child(child), stdin, stdout, stderr, rx, Arc::clone(&ended)));
    Ok(WarmQueue { requests: tx, ended, base: Arc::default() })
}

/// How the serving task learns the warm process's end.
enum Exit {
    /// This process's child, killed with the task, waited for.
    Child(tokio::process::Child),
    /// The front end's (`NESTOR_WARM_FDS`): not ours to wait for; it ends
    /// when its requests' pipe closes.
    Offered(i32),
}

/// What the task keeps: forks asked for, ranks running, exits that came first.
#[derive(Default)]
struct Book {
    asked: HashMap<u64, ForkReply>,
    running: HashMap<i32, oneshot::Sender<std::io::Result<ExitStatus>>>,
    early: HashMap<i32, ExitStatus>,
    next_id: u64,
}

impl Book {
    fn answer(&mut self, a: Answer) {
        if let (Some(pid), Some(status)) = (a.exited, a.status) {
            let status = ExitStatus::from_raw(status);
            match self.running.remove(&pid) {
                Some(tx) => {
                    let _ = tx.send(Ok(status));
                }
                None => {
                    self.early.insert(pid, status);
                }
            }
            return;
        }
        let Some(reply) = a.id.and_then(|id| self.asked.remove(&id)) else { return };
        match (a.pid, a.error) {
            (Some(pid), _) => {
                let (tx, exit) = oneshot::channel();
                match self.early.remove(&pid) {
                    Some(status) => {
                        let _ = tx.send(Ok(status));
                    }
                    None => {
                        self.running.insert(pid, tx);
                    }
                }
                let _ = reply.send(Ok(Forked { pid, exit }));
            }
            (None, Some(e)) => {
                let _ = reply.send(Err(e));
            }
            (None, None) => {
                let _ = reply.send(Err("the warm worker process answered without a pid".into()));
            }
        }
    }

    fn fail_all(&mut self, why: &str) {
        for (_, reply) in self.asked.drain() {
            let _ = reply.send(Err(why.to_string()));
        }
        for (_, tx) in self.running.drain() {
            let _ = tx.send(Err(std::io::Error::other(why.to_string())));
        }
    }
}

async fn serve(
    exit: Exit,
    mut stdin: impl AsyncWrite + Unpin,
    stdout: impl AsyncRead + Unpin,
    stderr: impl AsyncRead + Unpin,
    mut requests: mpsc::UnboundedReceiver<Request>,
    ended: Arc<OnceLock<String>>,
) {
    let mut book = Book::default();
    let mut lines = BufReader::new(stdout).lines();
    let mut err_lines = BufReader::new(stderr).lines();
    let mut tail: VecDeque<String> = VecDeque::new();
    let mut err_open = true;
    let why = loop {
        tokio::select! {
            req = requests.recv() => {
                let Some(Request { spec, reply }) = req else {
                    // The backend is gone: so is the warm process (kill_on_drop).
                    return;
                };
                let id = book.next_id;
                book.next_id += 1;
                let mut line = match serde_json::to_vec(&Wire { id, spec: &spec }) {
                    Ok(l) => l,
                    Err(e) => { let _ = reply.send(Err(e.to_string())); continue; }
                };
                line.push(b'\n');
                book.asked.insert(id, reply);
                if let Err(e) = stdin.write_all(&line).await {
                    break format!("cannot write to the warm worker process: {e}");
                }
            }
            line = lines.next_line() => match line {
                Ok(Some(l)) => match serde_json::from_str::<Answer>(&l) {
                    Ok(a) => book.answer(a),
                    Err(e) => tracing::warn!("the warm worker process wrote {l:?}: {e}"),
                },
                Ok(None) | Err(_) => break String::new(),
            },
            line = err_lines.next_line(), if err_open => match line {
                Ok(Some(l)) => {
                    tracing::info!(target: "nestor::warm", "{l}");
                    tail.push_back(l);
                    if tail.len() > 30 { tail.pop_front(); }
                }
                _ => err_open = false,
            },
        }
    };
    // Its output so far, then how it ended.
    while let Ok(Ok(Some(l))) = tokio::time::timeout(std::time::Duration::from_millis(200), err_lines.next_line()).await {
        tail.push_back(l);
        if tail.len() > 30 {
            tail.pop_front();
        }
    }
    let status = match exit {
        Exit::Child(mut child) => child.wait().await.map(describe_exit).unwrap_or_else(|e| format!("could not be waited for: {e}")),
        Exit::Offered(pid) => format!("(pid {pid}, forked by the front end) ended"),
    };
    let shown: Vec<String> = tail.into_iter().collect();
    let why = format!(
        "the warm worker process {status}{}{}",
        if why.is_empty() { String::new() } else { format!(" ({why})") },
        if shown.is_empty() { String::new() } else { format!("; its last lines:\n{}", shown.join("\n")) }
    );
    // Later requests hear the same, even one sent after the queue closes.
    let _ = ended.set(why.clone());
    book.fail_all(&why);
    requests.close();
    while let Some(Request { reply, .. }) = requests.recv().await {
        let _ = reply.send(Err(why.clone()));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn spec() -> RankSpec {
        RankSpec { env: BTreeMap::new(), cwd: std::env::temp_dir(), log: std::env::temp_dir().join("nestor-warm-test.log"), blob: None }
    }

    /// A warm process that dies at start (an import that fails): every
    /// request, sent before its end or long after, hears how it ended.
    #[tokio::test]
    async fn a_warm_process_that_dies_at_start_names_why_to_every_request() {
        let pool = WarmPool::default();
        let dying = || {
            let mut c = tokio::process::Command::new("sh");
            c.args(["-c", "echo \"ModuleNotFoundError: No module named 'only_here'\" >&2; exit 3"]);
            c
        };
        let early = pool.queue(dying).unwrap();
        let first = early.fork(spec()).await.err().expect("no rank from a dead warm process");
        assert!(first.contains("exited with code 3") && first.contains("only_here"), "{first}");
        // Long after: the queue is closed, and a request still hears why.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !early.requests.is_closed() {
            assert!(tokio::time::Instant::now() < deadline, "the queue never closed");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let late = early.fork(spec()).await.err().expect("no rank from a dead warm process");
        assert_eq!(late, first);
        // The pool starts a new process for the next run.
        let again = pool.queue(dying).unwrap();
        assert!(!again.requests.same_channel(&early.requests));
    }
}
