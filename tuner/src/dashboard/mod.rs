//! `nestor dashboard`: a web page served by the binary (its assets are
//! embedded; no network is needed) showing one or more experiments: the
//! trial table, every trial's learning curve, config against metric
//! (parallel coordinates, parameter importance) and one trial's detail. It
//! follows a running sweep live and works on finished experiments.
//!
//! The server keeps a `Board` per experiment in memory; a thread brings
//! the boards up to date once a second (see board.rs for how, without the
//! store's lock). The page asks for what changed since its last look: the
//! table when the board's version moved, and only the points it has not
//! seen (`after`), so a long sweep's history is sent once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

mod board;

use board::{importance, Board};

/// How often boards are brought up to date.
const REFRESH: Duration = Duration::from_millis(1000);

const INDEX: &str = include_str!("../../assets/dashboard/index.html");
const APP: &str = include_str!("../../assets/dashboard/app.js");
const UPLOT: &str = include_str!("../../assets/dashboard/vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../../assets/dashboard/vendor/uPlot.min.css");

/// One experiment the server shows: its directory, and its board once it
/// can be read (a sweep started with `--dashboard` has none at first).
struct Slot {
    dir: PathBuf,
    board: RwLock<Option<Board>>,
}

#[derive(Clone)]
struct Shared {
    slots: Arc<Vec<Slot>>,
    token: Arc<str>,
    /// The cookie the token is kept in after the first load (one per port:
    /// browsers share cookies between a host's ports).
    cookie: Arc<str>,
    /// The names a request's `Host` may give besides IP addresses (a page
    /// reached by another name is a DNS rebinding).
    hosts: Arc<Vec<String>>,
}

/// A dashboard server's settings.
#[derive(Debug, Clone)]
pub struct DashboardOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// Required of every request: `?token=` on the first load (kept in an
    /// HttpOnly cookie from then on), the cookie, or `Authorization: Bearer`.
    pub token: String,
}

/// Checks that every directory is an experiment: the first that is not
/// gives the error, naming it.
pub fn check_dirs(dirs: &[PathBuf]) -> Result<(), String> {
    for d in dirs {
        Board::open(d).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A random token (128 bits, hex) for a dashboard.
pub fn new_token() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..32).map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0')).collect()
}

/// Serves the dashboard of `dirs` until the process ends; `bound` is told
/// the address once it listens. Experiments that cannot be read yet (a
/// sweep just starting) are looked for again every second.
pub async fn serve(dirs: Vec<PathBuf>, options: DashboardOptions, bound: impl FnOnce(SocketAddr)) -> std::io::Result<()> {
    let slots: Vec<Slot> = dirs.into_iter().map(|dir| Slot { board: RwLock::new(Board::open(&dir).ok()), dir }).collect::<Vec<_>>();
    if options.token.len() < 16 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the dashboard's token must have at least 16 characters"));
    }
    let shared = Shared {
        slots: Arc::new(slots),
        token: Arc::from(options.token),
        cookie: Arc::from(format!("nestor_dashboard_{}", options.addr.port())),
        hosts: Arc::new(host_names()),
    };
    let refresher = Arc::clone(&shared.slots);
    std::thread::Builder::new().name("nestor-dashboard".into()).spawn(move || loop {
        std::thread::sleep(REFRESH);
        for slot in refresher.iter() {
            refresh(slot);
        }
    })?;
    let listener = tokio::net::TcpListener::bind(options.addr).await?;
    let addr = listener.local_addr()?;
    let shared = Shared { cookie: Arc::from(format!("nestor_dashboard_{}", addr.port())), ..shared };
    bound(addr);
    axum::serve(listener, router(shared)).await
}

fn refresh(slot: &Slot) {
    let missing = slot.board.read().map(|b| b.is_none()).unwrap_or(false);
    if missing {
        if let Ok(b) = Board::open(&slot.dir) {
            if let Ok(mut w) = slot.board.write() {
                *w = Some(b);
            }
        }
        return;
    }
    if let Ok(mut w) = slot.board.write() {
        if let Some(b) = w.as_mut() {
            b.refresh();
        }
    }
}

fn router(shared: Shared) -> Router {
    Router::new()
        .route("/", get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX) }))
        .route("/assets/app.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], APP) }))
        .route("/assets/uPlot.iife.min.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], UPLOT) }))
        .route("/assets/uPlot.min.css", get(|| async { ([(header::CONTENT_TYPE, "text/css")], UPLOT_CSS) }))
        .route("/api/experiments", get(experiments))
        .route("/api/experiments/{i}", get(experiment))
        .route("/api/experiments/{i}/curves", get(curves))
        .route("/api/experiments/{i}/importance", get(importance_of))
        .route("/api/experiments/{i}/trials/{id}", get(trial))
        .layer(axum::middleware::from_fn_with_state(shared.clone(), authorize))
        .layer(axum::middleware::map_response(secure_headers))
        .with_state(shared)
}

/// This machine's names a browser may reach the dashboard by: `localhost`
/// and the host name (a name below it, `node1.cluster.example`, too).
fn host_names() -> Vec<String> {
    let mut names = vec!["localhost".to_string()];
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        names.extend(std::str::from_utf8(&buf[..end]).ok().filter(|n| !n.is_empty()).map(str::to_ascii_lowercase));
    }
    names
}

/// Whether a request's `Host` names this server: an IP address, or one of
/// `names` (a name of its own below one of them too). Anything else is a
/// page of another site that resolved its name to this machine.
fn host_allowed(host: &str, names: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => return v6.split(']').next().is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
        None => host.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).map_or(host, |(h, _)| h),
    };
    let name = name.to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || names.iter().any(|n| name == *n || (n != "localhost" && name.strip_prefix(n.as_str()).is_some_and(|rest| rest.starts_with('.'))))
}

async fn authorize(State(s): State<Shared>, headers: HeaderMap, req: Request, next: Next) -> Response {
    let refuse = |code: StatusCode, why: &'static str| (code, why).into_response();
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !host_allowed(host, &s.hosts) {
        return refuse(StatusCode::FORBIDDEN, "this dashboard answers to this machine's names and addresses only\n");
    }
    // A page of another origin may not read it either.
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        if origin.split_once("://").map(|(_, rest)| rest) != Some(host) {
            return refuse(StatusCode::FORBIDDEN, "requests from another origin are refused\n");
        }
    }
    let token = &*s.token;
    let in_query = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv.strip_prefix("token=").is_some_and(|t| trainer::secrets_equal(t, token))));
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| k == &*s.cookie && trainer::secrets_equal(v, token));
    if in_query && req.uri().path() == "/" {
        // The first load: the token goes into a cookie scripts cannot read, and out of the address bar.
        let set = format!("{}={token}; HttpOnly; SameSite=Strict; Path=/", s.cookie);
        return (StatusCode::SEE_OTHER, [(header::SET_COOKIE, set), (header::LOCATION, "/".to_string())]).into_response();
    }
    if in_query || cookie || bearer.is_some_and(|b| trainer::secrets_equal(b, token)) {
        next.run(req).await
    } else {
        refuse(StatusCode::UNAUTHORIZED, "a token is required: open the URL nestor dashboard printed\n")
    }
}

/// What every answer carries: scripts and styles of this server only, no
/// framing, no sniffing, no referrer (an address never leaves with the page).
async fn secure_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    let policy = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                  connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'";
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, policy),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        h.insert(name, axum::http::HeaderValue::from_static(value));
    }
    r
}

type ApiResult = Result<axum::Json<Value>, (StatusCode, String)>;

fn with_board<T>(s: &Shared, i: usize, f: impl FnOnce(&Board) -> T) -> Result<T, (StatusCode, String)> {
    let slot = s.slots.get(i).ok_or((StatusCode::NOT_FOUND, format!("no experiment {i}")))?;
    let guard = slot.board.read().map_err(|_| (StatusCode::INTERNAL_SERVER_ERROR, "a board is poisoned".to_string()))?;
    let board = guard.as_ref().ok_or((StatusCode::SERVICE_UNAVAILABLE, format!("{} has no results yet", slot.dir.display())))?;
    Ok(f(board))
}

fn summary(i: usize, b: &Board) -> Value {
    let count = |s: &str| b.rows.iter().filter(|r| r.status == s).count();
    json!({
        "index": i, "name": b.name, "dir": b.dir, "metric": b.metric, "mode": b.mode, "live": b.live,
        "epoch": b.epoch, "version": b.version, "points": b.log.len(), "trials": b.rows.len(),
        "counts": {
            "RUNNING": count("RUNNING"), "TERMINATED": count("TERMINATED"), "ERROR": count("ERROR"),
            "PAUSED": count("PAUSED"), "PENDING": count("PENDING"),
        },
        "status": b.status,
    })
}

async fn experiments(State(s): State<Shared>) -> ApiResult {
    let mut out = Vec::new();
    for (i, slot) in s.slots.iter().enumerate() {
        let v = slot.board.read().ok().and_then(|b| b.as_ref().map(|b| summary(i, b)));
        out.push(v.unwrap_or_else(|| json!({"index": i, "name": slot.dir.file_name().map(|n| n.to_string_lossy().into_owned()), "dir": slot.dir, "waiting": true})));
    }
    Ok(axum::Json(Value::Array(out)))
}

async fn experiment(State(s): State<Shared>, UrlPath(i): UrlPath<usize>) -> ApiResult {
    with_board(&s, i, |b| {
        let mut v = summary(i, b);
        v["metrics"] = json!(b.metric_names());
        v["log_params"] = json!(b.log_params);
        v["trials_table"] = json!(b.rows);
        v["exploits"] = json!(b.exploits);
        axum::Json(v)
    })
}

#[derive(Deserialize)]
struct CurvesQuery {
    metric: String,
    /// Points the page has (of this epoch).
    #[serde(default)]
    after: usize,
}

/// One trial's points: iterations, `time_total_s`, the metric's values.
type Columns = (Vec<u64>, Vec<Value>, Vec<Value>);

/// Points after `after`, per trial: `[iterations, time_total_s, values]`.
async fn curves(State(s): State<Shared>, UrlPath(i): UrlPath<usize>, Query(q): Query<CurvesQuery>) -> ApiResult {
    with_board(&s, i, |b| {
        let mut per: Vec<Option<Columns>> = vec![None; b.rows.len()];
        let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
        for &(t, pos) in b.log.iter().skip(q.after) {
            let c = &b.curves[t as usize];
            let Some(col) = c.values.get(&q.metric) else { continue };
            let e = per[t as usize].get_or_insert_with(Default::default);
            e.0.push(c.iter[pos as usize]);
            e.1.push(num(c.time[pos as usize]));
            e.2.push(num(col[pos as usize]));
        }
        let trials: serde_json::Map<String, Value> =
            per.into_iter().enumerate().filter_map(|(t, e)| Some((b.rows[t].id.clone(), json!(e?)))).collect();
        axum::Json(json!({"epoch": b.epoch, "next": b.log.len(), "trials": trials}))
    })
}

#[derive(Deserialize)]
struct MetricQuery {
    metric: String,
}

async fn importance_of(State(s): State<Shared>, UrlPath(i): UrlPath<usize>, Query(q): Query<MetricQuery>) -> ApiResult {
    with_board(&s, i, |b| {
        let scores = b.scores(&q.metric);
        let (configs, values): (Vec<&Value>, Vec<f64>) = b.rows.iter().zip(scores).filter_map(|(r, s)| Some((&r.config, s?))).unzip();
        let imp: Vec<Value> = importance(&configs, &values).into_iter().map(|(k, v)| json!({"param": k, "importance": v})).collect();
        axum::Json(json!({"metric": q.metric, "trials": values.len(), "importance": imp}))
    })
}

/// Lines at the end of each rank's log.
const LOG_TAIL: usize = 40;
/// At most this much of a log's end is read for them, however long the log.
const LOG_TAIL_BYTES: u64 = 64 << 10;
/// Logs shown of one trial.
const LOGS_SHOWN: usize = 64;

/// The last [`LOG_TAIL`] lines of the file at `path`, read from its end
/// (a log of gigabytes costs what its last 64 KiB do).
fn log_tail(path: &std::path::Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map_or(0, |m| m.len());
    let start = len.saturating_sub(LOG_TAIL_BYTES);
    let mut bytes = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_err() || f.take(LOG_TAIL_BYTES).read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    // A read that began mid-line drops that line's part.
    let text = if start > 0 { text.split_once('\n').map_or("", |(_, rest)| rest) } else { &text };
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
}

async fn trial(State(s): State<Shared>, UrlPath((i, id)): UrlPath<(usize, String)>) -> ApiResult {
    let (row, points, trial_dir, exploits) = with_board(&s, i, |b| {
        let (row, curve) = b.row(&id)?;
        let exploits: Vec<Value> =
            b.exploits.iter().filter(|e| e["trial_id"] == id.as_str() || e["donor"] == id.as_str()).cloned().collect();
        Some((json!(row), curve.iter.len(), b.dir.join("trials").join(&id), exploits))
    })?
    .ok_or((StatusCode::NOT_FOUND, format!("no trial {id}")))?;
    let logs = tokio::task::spawn_blocking(move || {
        let mut logs = serde_json::Map::new();
        if let Ok(entries) = std::fs::read_dir(trial_dir.join("logs")) {
            let mut names: Vec<PathBuf> =
                entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_file())).map(|e| e.path()).collect();
            names.sort();
            for p in names.into_iter().take(LOGS_SHOWN) {
                let tail = log_tail(&p);
                logs.insert(p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), json!(tail));
            }
        }
        logs
    })
    .await
    .unwrap_or_default();
    Ok(axum::Json(json!({"trial": row, "points": points, "exploits": exploits, "logs": logs})))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_this_machines_names_and_addresses_are_answered() {
        let names = vec!["localhost".to_string(), "node1".to_string()];
        for ok in ["127.0.0.1:8265", "localhost:8265", "LOCALHOST", "10.1.2.3", "[::1]:8265", "node1:80", "node1.cluster.example:8265"] {
            assert!(host_allowed(ok, &names), "{ok}");
        }
        for bad in ["evil.example", "evil.example:8265", "", "node1x.example", "localhost.evil.example", "[evil]:1"] {
            assert!(!host_allowed(bad, &names), "{bad}");
        }
    }

    #[test]
    fn a_tail_is_read_from_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rank-0.log");
        let text: String = (0..200_000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&p, text).unwrap();
        let tail = log_tail(&p);
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), LOG_TAIL);
        assert_eq!((lines[0], lines[LOG_TAIL - 1]), ("line 199960", "line 199999"));
        std::fs::write(&p, "a\nb\n").unwrap();
        assert_eq!(log_tail(&p), "a\nb");
        assert_eq!(log_tail(&dir.path().join("none")), "");
    }
}
