//! The dashboard's first paint on a big experiment: `nestor simulate`
//! replays 1,000 trials of 100 iterations each (100,000 results, FIFO, so
//! none is cut short) into a real store; `nestor dashboard` serves it; a
//! headless Chromium loads the page, and the page records when its table,
//! curves and parallel coordinates were first drawn (`performance.now()`,
//! from navigation start). Also: the server's time to read the store, the
//! page's weight and the size of the first API answers.
//!
//!   cargo bench -p nestor-tests --bench dashboard -- [--trials N] [--iterations M] [--runs R]

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn nestor() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("target/release/nestor")
}

/// `url`'s body, asked with the dashboard's `token`.
fn get(url: &str, token: &str) -> Vec<u8> {
    let out = Command::new("curl").args(["-s", "--compressed", "-H", &format!("Authorization: Bearer {token}"), url]).output().unwrap();
    out.stdout
}

fn main() {
    let (trials, iterations, runs) = (arg("--trials", 1000), arg("--iterations", 100), arg("--runs", 3));
    let dir = tempfile::tempdir().unwrap();
    let curves = dir.path().join("curves.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&curves).unwrap());
    for t in 0..trials {
        let lr = 10f64.powf(-4.0 + 3.0 * (t as f64 * 0.618_033_988_7).fract());
        let limit = (lr.log10() + 2.5).powi(2) * 0.1 + 0.05;
        let metrics: Vec<f64> = (1..=iterations).map(|i| limit + 1.0 / (1.0 + i as f64 * lr * 100.0)).collect();
        writeln!(
            f,
            "{}",
            serde_json::json!({"config": {"lr": lr, "width": 16 << (t % 4)}, "metrics": metrics, "seconds_per_iteration": 1.0})
        )
        .unwrap();
    }
    drop(f);
    std::fs::write(
        dir.path().join("sweep.toml"),
        format!("[experiment]\nname = \"big\"\nmetric = \"loss\"\nmode = \"min\"\nnum_samples = {trials}\nseed = 1\n\n[scheduler]\ntype = \"fifo\"\n"),
    )
    .unwrap();
    let start = Instant::now();
    let out = Command::new(nestor())
        .args(["simulate", "sweep.toml", "--curves", "curves.jsonl", "--storage", "runs", "--workers", "16"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    println!(
        "experiment: {trials} trials x {iterations} iterations ({} results), simulated in {:.1} s",
        trials * iterations,
        start.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let mut server = Command::new(nestor())
        .args(["dashboard", "runs/big", "--port", "0"])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = BufReader::new(server.stdout.take().unwrap()).lines().next().unwrap().unwrap();
    let url = line.strip_prefix("nestor dashboard: ").unwrap().to_string();
    // `http://127.0.0.1:<port>/?token=<token>`: the page's address, and the token the API wants.
    let (base, token) = url.split_once("?token=").map(|(b, t)| (b.to_string(), t.to_string())).unwrap();
    println!("server: store read and listening in {:.2} s", started.elapsed().as_secs_f64());
    let page: usize = ["", "assets/app.js", "assets/uPlot.iife.min.js", "assets/uPlot.min.css"]
        .iter()
        .map(|p| get(&format!("{base}{p}"), &token).len())
        .sum();
    let table = get(&format!("{base}api/experiments/0"), &token).len();
    let t = Instant::now();
    let curves = get(&format!("{base}api/experiments/0/curves?metric=loss&after=0"), &token).len();
    let curves_s = t.elapsed().as_secs_f64();
    println!(
        "page: {:.1} KiB of HTML, JS and CSS; first answers: table {:.0} KiB, curves {:.0} KiB ({curves_s:.2} s)",
        page as f64 / 1024.0,
        table as f64 / 1024.0,
        curves as f64 / 1024.0
    );

    let mut paints = Vec::new();
    for _ in 0..runs {
        let profile = tempfile::tempdir().unwrap();
        let t = Instant::now();
        let out = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--window-size=1400,1300",
                "--virtual-time-budget=30000",
                "--dump-dom",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(&url)
            .output()
            .unwrap();
        let wall = t.elapsed().as_secs_f64();
        let dom = String::from_utf8_lossy(&out.stdout);
        let ms: f64 = dom
            .split("data-ms=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse().ok())
            .expect("the page recorded its first paint");
        let series = dom.split("data-series=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or("?").to_string();
        println!("first paint: {:.0} ms ({series} curves drawn; chromium ran {wall:.1} s in all)", ms);
        paints.push(ms);
    }
    paints.sort_by(f64::total_cmp);
    println!("first paint median: {:.0} ms over {runs} loads", paints[paints.len() / 2]);
    let _ = server.kill();
    let _ = server.wait();
}
