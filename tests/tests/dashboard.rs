//! The dashboard, rendered by a real headless Chromium: while a sweep of
//! real worker processes runs under `nestor run --dashboard` (a page kept
//! open through chromedriver redraws itself as results come), and once it
//! has finished, under `nestor dashboard`. The page's DOM says what it drew
//! (rows, series, points, lines); screenshots are kept under target/.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn chromium() -> PathBuf {
    apt_install("/usr/bin/chromedriver", &["chromium", "chromium-driver"], "a headless Chromium renders the dashboard in these tests");
    apt_install("/usr/bin/curl", &["curl"], "these tests talk to chromedriver with curl");
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .map(|n| Path::new("/usr/bin").join(n))
        .find(|p| p.exists())
        .expect("a headless Chromium (apt-get install chromium) renders the dashboard in this test");
    // A new machine's first Chromium builds its font cache (fontconfig), which
    // takes tens of seconds: done once here, before anything is timed.
    static WARM: std::sync::Once = std::sync::Once::new();
    WARM.call_once(|| {
        let started = std::time::Instant::now();
        let _ = Command::new("fc-cache").output();
        let profile = tempfile::tempdir().unwrap();
        let _ = Command::new(&found)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--dump-dom", "about:blank"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .output();
        eprintln!("chromium warmed up in {:.1} s", started.elapsed().as_secs_f64());
    });
    found
}

/// Chromium's DOM of `url` after its scripts ran for `budget_ms` of virtual time; a screenshot to `png`.
fn render(url: &str, budget_ms: u32, png: &Path) -> String {
    let profile = tempfile::tempdir().unwrap();
    let flags = |c: &mut Command| {
        c.args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1400,1300"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--virtual-time-budget={budget_ms}"));
    };
    let mut shot = Command::new(chromium());
    flags(&mut shot);
    let out = shot.arg(format!("--screenshot={}", png.display())).arg(url).output().unwrap();
    assert!(png.exists(), "no screenshot: {}", String::from_utf8_lossy(&out.stderr));
    let mut dump = Command::new(chromium());
    flags(&mut dump);
    let out = dump.arg("--dump-dom").arg(url).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The finished experiment at `exp` served by `nestor dashboard`, rendered
/// (a screenshot named `shot` kept); its DOM.
fn served(dir: &Path, exp: &str, shot: &str) -> String {
    let mut server = spawn_nestor(dir, &["dashboard", exp, "--port", "0"], &[]);
    let mut out = BufReader::new(server.stdout.take().unwrap()).lines();
    let url = out.next().unwrap().unwrap().strip_prefix("nestor dashboard: ").unwrap().to_string();
    let dom = render(&url, 3000, &shots_dir().join(shot));
    server.kill().unwrap();
    let _ = server.wait();
    dom
}

/// A page kept open in a real browser (chromedriver, W3C WebDriver over
/// HTTP), in real time: what its scripts say, asked while it runs.
struct OpenPage {
    driver: std::process::Child,
    base: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl OpenPage {
    fn call(&self, method: &str, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let out = Command::new("curl")
            .args(["-s", "-X", method, "-H", "Content-Type: application/json", "-d", &body.to_string()])
            .arg(format!("{}{path}", self.base))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    fn open(url: &str) -> Self {
        chromium();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver (apt-get install chromium-driver) keeps the page open in this test");
        wait_for("chromedriver", 20.0, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        let profile = tempfile::tempdir().unwrap();
        let mut page = Self { driver, base: format!("http://127.0.0.1:{port}"), session: String::new(), _profile: profile };
        let args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1300"];
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": chromium(), "args": args.iter().map(|a| a.to_string()).chain([format!("--user-data-dir={}", page._profile.path().display())]).collect::<Vec<_>>()
        }}}});
        let s = page.call("POST", "/session", &caps);
        page.session = s["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("{s}")).to_string();
        page.call("POST", &format!("/session/{}/url", page.session), &serde_json::json!({"url": url}));
        page
    }

    /// The value `script` returns in the page.
    fn eval(&self, script: &str) -> serde_json::Value {
        let r = self.call("POST", &format!("/session/{}/execute/sync", self.session), &serde_json::json!({"script": script, "args": []}));
        r["value"].clone()
    }
}

impl Drop for OpenPage {
    fn drop(&mut self) {
        let _ = Command::new("curl").args(["-s", "-X", "DELETE"]).arg(format!("{}/session/{}", self.base, self.session)).output();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// The value of `attr="..."` on the element with `id`.
fn attr(dom: &str, id: &str, attr: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let tag_start = dom[..at].rfind('<')?;
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>')?];
    let key = format!("{attr}=\"");
    let v = &tag[tag.find(&key)? + key.len()..];
    Some(v[..v.find('"')?].to_string())
}

fn shots_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("target/dashboard-shots");
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_path_that_is_no_experiment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let out = nestor(dir.path(), &["dashboard", "empty", "--port", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("empty: not an experiment directory"), "{err}");
}

#[test]
fn the_page_draws_a_running_sweep_live_and_a_finished_one() {
    // The browser is ready before the sweep starts.
    chromium();
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        &sweep(
            "dash",
            "num_samples = 2\nmax_concurrent_trials = 2\nseed = 4",
            "x = { uniform = [0.0, 1.0] }\nlr = { loguniform = [0.0001, 0.1] }\nsteps = 40\nsleep_ms = 200\nfail_at = { grid = [100, 100, 7] }",
            "\n[failure]\nmax_failures = 0\n",
        ),
    );
    let mut run = spawn_nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs", "--dashboard", "0", "--plain"], &[]);
    let mut lines = BufReader::new(run.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("nestor printed the dashboard's address").unwrap();
        if let Some(u) = line.strip_prefix("nestor: dashboard at ") {
            break u.to_string();
        }
    };
    // Drain the rest, so the sweep never blocks on a full pipe.
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>().join("\n"));

    // While it runs: the running trials, their curves so far.
    // The page, kept open: it redraws as results come, with no reload.
    let page = OpenPage::open(&url);
    let drawn = |page: &OpenPage| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        page.eval("return +(document.getElementById('curves').dataset.points || 0)").as_u64().unwrap_or(0)
    };
    wait_for("the open page's first drawing", 30.0, || drawn(&page) > 0);
    let first = drawn(&page);
    wait_for("the open page to redraw with more points", 30.0, || drawn(&page) > first);
    let updates = page.eval("return +(document.getElementById('paint').dataset.updates || 0)").as_u64().unwrap_or(0);
    assert!(updates >= 1, "it redrew itself {updates} times");
    drop(page);
    let live = render(&url, 3000, &shots_dir().join("live.png"));
    assert_eq!(attr(&live, "badge", "id").as_deref(), Some("badge"));
    assert!(live.contains("class=\"live\""), "the page says the sweep is live");
    assert!(live.contains("RUNNING</span>"), "running trials are listed");
    let live_points: usize = attr(&live, "curves", "data-points").unwrap().parse().unwrap();
    assert!(live_points > 0, "curves of the running trials are drawn");

    assert!(run.wait().unwrap().success(), "{}", rest.join().unwrap());
    // Finished: served from the store by `nestor dashboard`.
    let dom = served(dir.path(), "runs/dash", "finished.png");
    assert_eq!(attr(&dom, "paint", "data-ms").map(|ms| ms.parse::<f64>().is_ok()), Some(true), "the page marks its first paint");
    assert!(dom.contains("class=\"done\""), "finished");
    for t in 0..6 {
        assert!(dom.contains(&format!("data-id=\"trial_0000{t}\"")), "trial_0000{t} is in the table");
    }
    // Every trial's curve, every stored point of it.
    let rows = export(dir.path(), "runs/dash");
    assert_eq!(attr(&dom, "curves", "data-series").as_deref(), Some("6"));
    assert_eq!(attr(&dom, "curves", "data-points").unwrap().parse::<usize>().unwrap(), rows.len());
    assert_eq!(attr(&dom, "parcoords", "data-lines").as_deref(), Some("6"));
    // The failed trials are marked ERROR, and the importance of x and lr is shown.
    assert_eq!(dom.matches("<td><span class=\"s-ERROR\">ERROR</span></td>").count(), 2, "two trials fail at 7");
    assert!(dom.contains("class=\"imp\""), "parameter importance is drawn");
    let axes = attr(&dom, "parcoords", "data-axes").unwrap();
    assert!(axes.contains("lr (log)") && axes.contains("x,") && axes.ends_with("loss"), "{axes}");
}

/// An experiment whose names are markup, served to a stranger and to a
/// page of another site: the browser shows the markup as text; requests
/// without the token, by another host name (DNS rebinding) or from another
/// origin are refused; the token moves from the address into a cookie
/// scripts cannot read; every answer carries a Content-Security-Policy.
#[test]
fn hostile_names_are_shown_as_text_and_strangers_are_refused() {
    chromium();
    let dir = tempfile::tempdir().unwrap();
    // Parameters named like nestor's own columns are columns of their own.
    let space = "x = 0.5\nsteps = 2\nGPU = 3\nstatus = \"mine\"\n\"<img src=x onerror=alert(1)>\" = \"<b id=injected>v</b>\"";
    write(dir.path(), &sweep("xss", "", space, ""));
    ok(common::nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    let refused = common::nestor(dir.path(), &["dashboard", "runs/xss", "--port", "0", "--token", ""]);
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("--token: at least 16"), "{refused:?}");
    let mut server = spawn_nestor(dir.path(), &["dashboard", "runs/xss", "--port", "0"], &[]);
    let mut out = BufReader::new(server.stdout.take().unwrap()).lines();
    let url = out.next().unwrap().unwrap().strip_prefix("nestor dashboard: ").unwrap().to_string();
    let (base, token) = url.split_once("/?token=").map(|(b, t)| (b.to_string(), t.to_string())).unwrap();
    let dom = render(&url, 3000, &shots_dir().join("hostile.png"));
    assert!(dom.contains("data-id=\"trial_00000\""), "the table is drawn:\n{dom}");
    assert!(!dom.contains("data-key=\"c:gpu\""), "no GPU column without GPU figures:\n{dom}");
    assert!(
        dom.contains("<th data-key=\"p:GPU\">GPU</th>") && dom.contains("<th data-key=\"p:status\">status</th>"),
        "parameters named like columns:\n{dom}"
    );
    assert!(dom.contains("<th data-key=\"c:id\">id ▲</th>"), "sorted by id at first:\n{dom}");
    assert!(dom.contains("<input type=\"checkbox\" data-state=\"TERMINATED\" checked=\"\">"), "the state filters are drawn:\n{dom}");
    assert!(!dom.contains("[object "), "an element was written as text:\n{dom}");
    assert!(dom.contains("&lt;img src=x onerror=alert(1)&gt;"), "the key is shown as text:\n{dom}");
    assert!(dom.contains("&lt;b id=injected&gt;v&lt;/b&gt;"), "the value is shown as text:\n{dom}");
    assert!(!dom.contains("<img src=\"x\"") && !dom.contains("id=\"injected\""), "markup of the experiment's became an element:\n{dom}");
    let curl = |args: &[&str]| -> String {
        let out = Command::new("curl").args(["-s", "-D", "-", "-o", "/dev/null"]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_ascii_lowercase()
    };
    let api = format!("{base}/api/experiments");
    let with_token = format!("{api}?token={token}");
    assert!(curl(&[&api]).starts_with("http/1.1 401"), "no token");
    assert!(curl(&[&format!("{api}?token=0123456789abcdef0123456789abcdef")]).starts_with("http/1.1 401"), "a wrong token");
    assert!(curl(&[&with_token]).starts_with("http/1.1 200"));
    assert!(curl(&["-H", &format!("Authorization: Bearer {token}"), &api]).starts_with("http/1.1 200"));
    assert!(curl(&["-H", "Host: evil.example", &with_token]).starts_with("http/1.1 403"), "another host name: DNS rebinding");
    assert!(curl(&["-H", "Origin: http://evil.example", &with_token]).starts_with("http/1.1 403"), "another origin");
    // The first load: the token goes into an HttpOnly cookie, and out of the address.
    let first = curl(&[&url]);
    let port = base.rsplit(':').next().unwrap();
    assert!(first.starts_with("http/1.1 303") && first.contains("location: /"), "{first}");
    assert!(first.contains(&format!("set-cookie: nestor_dashboard_{port}={token}; httponly; samesite=strict; path=/")), "{first}");
    let page = curl(&["-H", &format!("Cookie: nestor_dashboard_{port}={token}"), &format!("{base}/")]);
    assert!(page.starts_with("http/1.1 200"), "{page}");
    assert!(page.contains("content-security-policy: default-src 'self'; script-src 'self';"), "{page}");
    assert!(page.contains("x-frame-options: deny") && page.contains("referrer-policy: no-referrer"), "{page}");
    server.kill().unwrap();
    let _ = server.wait();
}

/// Trials whose results carry GPU figures (as the driver's sampler adds
/// them where a trial holds GPUs; here the worker reports them itself, as
/// no GPU is at hand): the table has a GPU column with each trial's mean
/// (peak) utilisation and mean memory, the trial's panel the whole line,
/// and `nestor status` the same line, out of its metrics column.
#[test]
fn gpu_figures_have_a_column_of_their_own() {
    chromium();
    let dir = tempfile::tempdir().unwrap();
    let gib = 1u64 << 30;
    let space = format!(
        "x = 0.5\nsteps = 2\n[space.extra_metrics]\ngpu_util_mean_percent = 63.0\ngpu_util_peak_percent = 98.0\ngpu_memory_mean_bytes = {}\ngpu_memory_peak_bytes = {}",
        21 * gib / 10,
        34 * gib / 10
    );
    write(dir.path(), &sweep("gpu", "", &space, ""));
    ok(common::nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]));
    let status = ok(common::nestor(dir.path(), &["status", "runs/gpu"]));
    assert!(status.contains("GPU: utilisation mean 63% (peak 98%), memory mean 2.1 GiB (peak 3.4 GiB)"), "{status}");
    // (The config names them too, under `extra_metrics.`.)
    assert!(!status.contains(" gpu_util") && !status.contains(" gpu_memory"), "the figures stay out of the metrics column:\n{status}");

    let dom = served(dir.path(), "runs/gpu", "gpu.png");
    assert!(dom.contains("<th data-key=\"c:gpu\">GPU</th>"), "a GPU column:\n{dom}");
    assert!(
        dom.contains(
            "<span class=\"gpu\" title=\"utilisation mean 63% (peak 98%), memory mean 2.1 GiB (peak 3.4 GiB)\">63% (98%) · 2.1 GiB</span>"
        ),
        "the trial's figures in it:\n{dom}"
    );
}
