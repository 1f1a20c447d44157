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
    token: Option<Arc<str>>,
}

/// A dashboard server's settings.
#[derive(Debug, Clone)]
pub struct DashboardOptions {
    /// Where to listen.
    pub addr: SocketAddr,
    /// Required of every request (`?token=` or `Authorization: Bearer`), if set.
    pub token: Option<String>,
}

/// Checks that every directory is an experiment: the first that is not
/// gives the error, naming it.
pub fn check_dirs(dirs: &[PathBuf]) -> Result<(), String> {
    for d in dirs {
        Board::open(d).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A random token for a dashboard that listens beyond loopback.
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
    let shared = Shared { slots: Arc::new(slots), token: options.token.map(Arc::from) };
    let refresher = Arc::clone(&shared.slots);
    std::thread::Builder::new().name("nestor-dashboard".into()).spawn(move || loop {
        std::thread::sleep(REFRESH);
        for slot in refresher.iter() {
            refresh(slot);
        }
    })?;
    let listener = tokio::net::TcpListener::bind(options.addr).await?;
    bound(listener.local_addr()?);
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
        .with_state(shared)
}

async fn authorize(State(s): State<Shared>, headers: HeaderMap, req: Request, next: Next) -> Response {
    let Some(token) = &s.token else { return next.run(req).await };
    let in_query = req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv.strip_prefix("token=") == Some(token)));
    let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if in_query || bearer == Some(token) {
        next.run(req).await
    } else {
        (StatusCode::UNAUTHORIZED, "a token is required: open the URL nestor dashboard printed\n").into_response()
    }
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
            let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            names.sort();
            for p in names {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n");
                logs.insert(p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), json!(tail));
            }
        }
        logs
    })
    .await
    .unwrap_or_default();
    Ok(axum::Json(json!({"trial": row, "points": points, "exploits": exploits, "logs": logs})))
}
