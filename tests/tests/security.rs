//! Attacks on nestor as a hostile neighbour on the same machine or
//! cluster network would try them, against the real binary: each is
//! refused (by name, before anything is written) or bounded. The
//! dashboard's are in `dashboard.rs` (they need its browser), Slurm's
//! report channel in `slurm.rs` (its TLS, the same as here, is what every
//! Slurm test's ranks speak).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::*;
use trainer::proto::report_request::Checkpoint;
use trainer::proto::reporter_client::ReporterClient;
use trainer::proto::ReportRequest;

/// `nestor run` of `text` in a fresh directory: its output, and whether
/// it left an experiment directory.
fn refused(text: &str, args: &[&str]) -> (String, bool) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), text);
    let mut all = vec!["run", "sweep.toml", "--storage", "runs"];
    all.extend_from_slice(args);
    let out = nestor(dir.path(), &all);
    assert!(!out.status.success(), "accepted:\n{}", String::from_utf8_lossy(&out.stdout));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    let left = std::fs::read_dir(dir.path().join("runs")).is_ok_and(|mut d| d.next().is_some());
    (said, left)
}

#[test]
fn bad_input_is_refused_by_name_before_anything_is_written() {
    let cases: Vec<(String, &str)> = vec![
        // A newline in a name would go into job names, log lines and scripts.
        (sweep("a\\nb", "", "x = 0.5", ""), "experiment.name"),
        (sweep("ok", "local_dir = \"runs/x\\ny\"", "x = 0.5", ""), "experiment.local_dir"),
        // Ten grid axes of 100: 10^20 trials.
        (
            sweep(
                "grid",
                "",
                &(0..10)
                    .map(|i| format!("p{i} = {{ grid = [{}] }}", (0..100).map(|v| v.to_string()).collect::<Vec<_>>().join(", ")))
                    .collect::<Vec<_>>()
                    .join("\n"),
                "",
            ),
            "more than 1000000000000 combinations",
        ),
        // Its samples would all be null.
        (sweep("q", "", "x = { quniform = [0.0, 1.0, 1e-300] }", ""), "is too small for"),
        (sweep("w", "", "x = 0.5", "num_workers = 4294967295"), "num_workers: must be at most 65536"),
        // An address nobody here can listen on.
        (sweep("bind", "", "x = 0.5", "report_bind = \"203.0.113.7:0\""), "trainer.report_bind"),
        (sweep("env", "", "x = 0.5", "pass_env = [\"NESTOR_SECURITY_TEST_UNSET\"]"), "pass_env"),
    ];
    for (text, names) in cases {
        let (said, left) = refused(&text, &[]);
        assert!(said.contains(names), "{names}: {said}");
        assert!(!left, "{names}: a refused sweep left a directory behind: {said}");
    }
    // A --storage whose name is not text is refused, not rewritten.
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &sweep("utf8", "", "x = 0.5", ""));
    let bad = std::ffi::OsStr::from_bytes(b"runs-\xff");
    let out = std::process::Command::new(nestor_bin())
        .args(["run", "sweep.toml", "--storage"])
        .arg(bad)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--storage: "), "{out:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "only sweep.toml is there");
}

#[test]
fn a_checkpoint_with_a_link_out_of_it_is_refused_and_nothing_is_copied() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "the neighbour's key").unwrap();
    let space = format!("x = 0.5\nsteps = 3\ncheckpoint = true\nlink_in_checkpoint = {:?}", secret.display().to_string());
    write(dir.path(), &sweep("links", "", &space, ""));
    let out = nestor(dir.path(), &["run", "sweep.toml", "--storage", "runs"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let grid = tuner::ResultGrid::load(&dir.path().join("runs/links")).unwrap();
    let t = grid.get("trial_00000").unwrap();
    assert_eq!(t.status, tuner::TrialStatus::Error, "{text}");
    // The rank is told, naming the file (a rank that persists its own shard refuses it itself;
    // the driver's refusal of one sent to it is in the report channel's test).
    let log = std::fs::read_to_string(dir.path().join("runs/links/trials/trial_00000/logs/rank-0.log")).unwrap();
    assert!(log.contains("/stolen is a symbolic link: a checkpoint holds regular files and directories only"), "{log}");
    // Nothing of the file reached the experiment.
    let mut stack = vec![dir.path().join("runs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let ty = e.file_type().unwrap();
            if ty.is_dir() {
                stack.push(e.path());
            } else if ty.is_file() && !e.path().to_string_lossy().contains("/logs/") {
                let bytes = std::fs::read(e.path()).unwrap();
                assert!(!bytes.windows(19).any(|w| w == b"the neighbour's key"), "{} holds the secret", e.path().display());
            }
        }
    }
}

/// Starts a sweep whose trial runs a while, and returns it with the
/// report server's address and the trial's id (from the rank's dump).
fn running_trial(dir: &Path) -> (std::process::Child, String, String) {
    running_trial_with(dir, "")
}

/// [`running_trial`], with `trainer` added to its `[trainer]` section.
fn running_trial_with(dir: &Path, trainer: &str) -> (std::process::Child, String, String) {
    write(dir, &sweep("probe", "", "x = 0.5\nsteps = 60\nsleep_ms = 100\ndump_env = true", trainer));
    let mut run = spawn_run(dir);
    let dump = dir.join("runs/probe/trials/trial_00000/rank-0.json");
    wait_for_run("the rank's dump", 30.0, &mut run, || std::fs::read_to_string(&dump).is_ok_and(|t| t.ends_with('}')));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&dump).unwrap()).unwrap();
    (run, v["NESTOR_ADDR"].as_str().unwrap().to_string(), v["NESTOR_TRIAL_ID"].as_str().unwrap().to_string())
}

#[test]
fn the_report_channel_answers_strangers_alike_and_logs_them_bounded_and_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let (run, addr, trial) = running_trial(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = ReporterClient::connect(addr.clone()).await.unwrap();
        let ask = |trial_id: &str, token: &str| ReportRequest {
            version: 1,
            trial_id: trial_id.into(),
            token: token.into(),
            rank: 0,
            metrics: [("loss".to_string(), 0.0)].into_iter().collect(),
            ..Default::default()
        };
        // A wrong token for a running trial, and a trial that does not exist: one answer.
        let wrong = client.report(ask(&trial, "0123456789abcdef0123456789abcdef")).await.unwrap_err();
        let unknown = client.report(ask("trial_99999", "0123456789abcdef0123456789abcdef")).await.unwrap_err();
        assert_eq!((wrong.code(), wrong.message()), (unknown.code(), unknown.message()));
        assert!(wrong.message().contains("unknown trial or wrong token"), "{}", wrong.message());
        // A flood, each naming a trial with a forged log line in it.
        for i in 0..2_000 {
            let _ = client.report(ask(&format!("t{i}\nFORGED 2026-01-01T00:00:00Z INFO all is well"), "x")).await;
        }
        // With the run's token (read from a rank's environment, as anyone who sees one message could):
        // a checkpoint holding a link out of it, a FIFO, a loop, each refused naming the file.
        let pid = std::fs::read_to_string(dir.path().join("runs/probe/trials/trial_00000/rank-0.json")).unwrap();
        let pid: serde_json::Value = serde_json::from_str(&pid).unwrap();
        let environ = std::fs::read(format!("/proc/{}/environ", pid["pid"])).unwrap();
        let token = environ
            .split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(b"NESTOR_TOKEN="))
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .unwrap();
        let trial_dir = dir.path().join("runs/probe/trials/trial_00000");
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "the neighbour's key").unwrap();
        for (name, make) in [
            ("stolen", Box::new(|d: &Path| std::os::unix::fs::symlink(&secret, d.join("stolen")).unwrap()) as Box<dyn Fn(&Path)>),
            ("loop", Box::new(|d: &Path| std::os::unix::fs::symlink(".", d.join("loop")).unwrap())),
            ("pipe", Box::new(|d: &Path| assert!(std::process::Command::new("mkfifo").arg(d.join("pipe")).status().unwrap().success()))),
        ] {
            let planted = trial_dir.join(format!("planted-{name}"));
            std::fs::create_dir_all(planted.join("sub")).unwrap();
            make(&planted.join("sub"));
            let refused = client
                .report(ReportRequest { checkpoint: Some(Checkpoint::CheckpointDir(planted.display().to_string())), ..ask(&trial, &token) })
                .await
                .unwrap_err();
            assert!(refused.message().contains(&format!("sub/{name} is a ")), "{name}: {}", refused.message());
        }
    });
    signal(run.id(), libc::SIGINT);
    let out = run.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    let refused = log.lines().filter(|l| l.contains("report refused")).count();
    assert!((1..=10).contains(&refused), "{refused} refusal lines for 2,002 refusals:\n{log}");
    assert!(!log.lines().any(|l| l.starts_with("FORGED")), "a sender wrote a log line of its own:\n{log}");
    assert!(log.contains("t0\\nFORGED"), "the sender's newline is shown escaped:\n{log}");
    // No checkpoint was made of what was planted.
    let trial_dir = dir.path().join("runs/probe/trials/trial_00000");
    let ckpts: Vec<_> =
        std::fs::read_dir(&trial_dir).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("checkpoint_")).collect();
    assert!(ckpts.is_empty(), "{ckpts:?}");
}

#[test]
fn secrets_passed_by_name_reach_the_ranks_and_are_written_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[experiment]\nname = \"secret\"\n\n[space]\nx = 0.5\n\n[trainer]\ncommand = [\"sh\", \"-c\", \"echo got:$NESTOR_SECURITY_TEST_SECRET\"]\npass_env = [\"NESTOR_SECURITY_TEST_SECRET\"]\n";
    write(dir.path(), text);
    let value = "hunter2-value-that-must-stay-in-memory";
    let out = nestor_env(dir.path(), &["run", "sweep.toml", "--storage", "runs"], &[("NESTOR_SECURITY_TEST_SECRET".into(), value.into())]);
    let exp = dir.path().join("runs/secret");
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let log = std::fs::read_to_string(exp.join("trials/trial_00000/logs/rank-0.log")).unwrap_or_default();
    assert!(log.contains(&format!("got:{value}")), "the rank had it: {log}\n{said}");
    // Only the rank's own output (which printed it) holds it.
    let mut stack = vec![exp.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if !e.path().ends_with("logs/rank-0.log") {
                let bytes = std::fs::read(e.path()).unwrap();
                assert!(!bytes.windows(value.len()).any(|w| w == value.as_bytes()), "{} holds the secret", e.path().display());
            }
        }
    }
    assert!(std::fs::read_to_string(exp.join("experiment.toml")).unwrap().contains("pass_env = [\"NESTOR_SECURITY_TEST_SECRET\"]"));
    // The experiment is its owner's alone.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&exp).unwrap().permissions().mode() & 0o777, 0o700);
}

#[test]
fn credentials_in_a_tracking_uri_are_refused_and_never_printed() {
    let text =
        sweep("mlflow", "", "x = 0.5", "") + "\n[[callbacks]]\ntype = \"mlflow\"\ntracking_uri = \"http://me:pa55word@127.0.0.1:9\"\n";
    let (said, left) = refused(&text, &[]);
    assert!(said.contains("MLFLOW_TRACKING_PASSWORD") && !said.contains("pa55word"), "{said}");
    assert!(!left, "{said}");
}

#[test]
fn a_batch_script_carries_nothing_the_user_named_but_as_sbatch_arguments() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &sweep("sub", "", "x = 0.5", ""));
    let submit = |args: &[&str]| {
        let mut all = vec!["submit", "sweep.toml", "--storage", "runs with space", "--nodes", "1", "--dry-run"];
        all.extend_from_slice(args);
        nestor(dir.path(), &all)
    };
    // A newline in an option would end the #SBATCH line and start a command.
    let out = submit(&["--partition", "gpu\ntouch owned"]);
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--partition: control characters"), "{out:?}");
    // Without control characters it is accepted, and stays an argument: the shell never reads it.
    let out = submit(&["--partition", "gpu$(touch owned)", "--time", "10"]);
    let script = ok(out);
    for line in script.lines().filter(|l| l.starts_with("#SBATCH")) {
        assert!(!line.contains("owned") && !line.contains("runs with space"), "{line}");
    }
    let submitted = script.lines().find(|l| l.starts_with("# Submitted as: sbatch ")).unwrap();
    assert!(submitted.contains("'--partition=gpu$(touch owned)'") && submitted.contains("'--output="), "{submitted}");
    // The script runs nothing of it: bash reads it (without running) and its only mention is that comment.
    let path = dir.path().join("script.sh");
    std::fs::write(&path, &script).unwrap();
    let check = std::process::Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    assert_eq!(script.matches("owned").count(), 1, "{script}");
    assert!(!dir.path().join("runs with space").exists(), "a dry run writes nothing");
}

/// This machine's address toward the rest of the network (no packet is
/// sent: a UDP socket's connect only picks the route).
fn outward_ip() -> std::net::IpAddr {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.connect("192.0.2.1:9").unwrap();
    s.local_addr().unwrap().ip()
}

/// A report server that listens where the network reaches it speaks TLS
/// only: the ranks are told its authority and report through it; a
/// plaintext caller, and one trusting another authority (a server in the
/// middle), get no answer at all, the run's token in hand or not.
#[test]
fn a_report_channel_off_loopback_is_tls_and_answers_no_one_else() {
    let dir = tempfile::tempdir().unwrap();
    let ip = outward_ip();
    assert!(!ip.is_loopback(), "{ip}");
    let (run, addr, trial) = running_trial_with(dir.path(), &format!("report_bind = \"{ip}:0\""));
    assert!(addr.starts_with(&format!("https://{ip}:")), "{addr}");
    let dump = std::fs::read_to_string(dir.path().join("runs/probe/trials/trial_00000/rank-0.json")).unwrap();
    let pid = serde_json::from_str::<serde_json::Value>(&dump).unwrap()["pid"].clone();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let var = |name: &str| {
        environ
            .split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(format!("{name}=").as_bytes()))
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .unwrap()
    };
    let plan: serde_json::Value = serde_json::from_str(&var("NESTOR_RUN")).unwrap();
    let (ca, token) = (plan["channel"]["tls_ca"].as_str().unwrap().to_string(), var("NESTOR_TOKEN"));
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    let other = trainer::tls::ReportTls::generate().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let ask = |token: &str| ReportRequest {
            version: 1,
            trial_id: trial.clone(),
            token: token.into(),
            metrics: [("loss".to_string(), 0.0)].into_iter().collect(),
            ..Default::default()
        };
        // Plaintext HTTP/2 to the same port: no gRPC answer, whatever is sent.
        let plain = addr.replace("https://", "http://");
        if let Ok(channel) = tonic::transport::Endpoint::from_shared(plain).unwrap().connect().await {
            let err = ReporterClient::new(channel).report(ask(&token)).await.unwrap_err();
            assert_ne!(err.code(), tonic::Code::Unauthenticated, "a plaintext call reached the service: {err:?}");
        }
        // Trusting another authority: the handshake fails.
        let wrong = trainer::tls::endpoint(&addr, Some(other.ca_pem())).unwrap().connect().await;
        assert!(wrong.is_err(), "connected to the driver trusting another authority");
        // The rank's own settings: through, and checked as any report is.
        let channel = trainer::tls::endpoint(&addr, Some(&ca)).unwrap().connect().await.unwrap();
        let refused = ReporterClient::new(channel).report(ask("0123456789abcdef0123456789abcdef")).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    });
    signal(run.id(), libc::SIGINT);
    let out = run.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("report refused"), "the wrong token over TLS was not logged");
}
