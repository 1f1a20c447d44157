//! The TensorBoard logger: an event file per trial run, readable by
//! TensorBoard itself (Ray Tune's `TBXLoggerCallback`, without a Python
//! writer).
//!
//! Each durable result becomes one scalar per numeric metric at its
//! `training_iteration`; the trial's config is written as HParams session
//! start info when the trial starts (so TensorBoard's HParams tab lists
//! running trials) and again after an exploit, and its end as session end
//! info. A trial that runs again from a checkpoint (a restart, a resumed
//! sweep) opens a new file that starts with a `SessionLog.START` at the
//! step it goes on from, so TensorBoard drops the steps the earlier run
//! wrote past its checkpoint: the curve shown is the one the trial has.
//!
//! The format: TFRecord framing (length, masked CRC32C of the length, the
//! record, masked CRC32C of it) around `tensorflow.Event` protocol
//! buffers; the messages are declared here with `prost`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use search::TrialResult;

use super::{Callback, CallbackError, Event};
use crate::files::{FileWrite, FileWriter};
use crate::store::TrialRecord;

/// `[[callbacks]] type = "tensorboard"`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorBoardConfig {
    /// Where the runs go, one directory per trial: `<dir>/<trial_id>/`.
    /// Relative to the experiment directory; by default each trial's own
    /// directory (`tensorboard --logdir <experiment>` shows them all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Put before every metric's name (`prefix = "tune/"`); none by default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

/// Writes TensorBoard event files for a sweep's trials.
///
/// Records are encoded on the callback's thread and buffered per file;
/// twice a second (at each status tick), at a trial's end and at the close
/// they go to the writer threads the files for people use, a trial's
/// files always to the same one: creating files is what costs on most
/// disks, and several threads keep up with a thousand short trials a
/// second where one cannot.
pub struct TensorBoardLogger {
    exp_dir: PathBuf,
    config: TensorBoardConfig,
    /// Each trial's current event file.
    files: HashMap<String, PathBuf>,
    /// Records not yet handed to the writers, per file.
    pending: HashMap<PathBuf, Vec<u8>>,
    writer: Option<FileWriter>,
    host: String,
    /// Event files made by this process, for unique names.
    made: u64,
}

/// Metrics a result carries that are not curves.
const NOT_SCALARS: [&str; 2] = ["training_iteration", "timestamp"];

impl TensorBoardLogger {
    /// A logger for the experiment at `exp_dir`.
    pub fn new(exp_dir: impl Into<PathBuf>, config: TensorBoardConfig) -> Self {
        Self { exp_dir: exp_dir.into(), config, files: HashMap::new(), pending: HashMap::new(), writer: None, host: hostname(), made: 0 }
    }

    /// The directory of `trial`'s event files.
    pub fn run_dir(&self, trial: &str) -> PathBuf {
        match &self.config.dir {
            Some(d) => self.exp_dir.join(d).join(trial),
            None => self.exp_dir.join("trials").join(trial),
        }
    }

    /// A new event file for `trial`, its version record first.
    fn open_file(&mut self, trial: &str, wall_time: f64) -> &mut Vec<u8> {
        self.made += 1;
        let name = format!("events.out.tfevents.{:010}.{}.{}.{}", wall_time as u64, self.host, std::process::id(), self.made);
        let path = self.run_dir(trial).join(name);
        self.files.insert(trial.to_string(), path.clone());
        let buf = self.pending.entry(path).or_default();
        write_record(buf, &proto::Event { wall_time, step: 0, what: Some(proto::What::FileVersion("brain.Event:2".into())) });
        buf
    }

    /// The buffer of `trial`'s current file (a new file if it has none).
    fn file(&mut self, trial: &str, wall_time: f64) -> &mut Vec<u8> {
        match self.files.get(trial) {
            Some(path) => self.pending.entry(path.clone()).or_default(),
            None => self.open_file(trial, wall_time),
        }
    }

    fn started(&mut self, trial: &TrialRecord) {
        let now = crate::clock::now_unix();
        // A run after another (a restart, a resize, an exploit, a resume):
        // its own file, which tells TensorBoard where it goes on from.
        let again = trial.restarts + trial.resumes + trial.resizes + trial.exploits > 0 || trial.num_results > 0;
        let hparams =
            hparams_event(now, "_hparams_/session_start_info", hparams_start(&trial.config, &trial.id, trial.started_at.unwrap_or(now)));
        let from = trial.latest_checkpoint.as_ref().map_or(0, |c| c.iteration);
        let buf = self.open_file(&trial.id, now);
        if again {
            let start = proto::SessionLog { status: 1, checkpoint_path: String::new(), msg: String::new() };
            write_record(buf, &proto::Event { wall_time: now, step: from as i64 + 1, what: Some(proto::What::SessionLog(start)) });
        }
        write_record(buf, &hparams);
    }

    fn result(&mut self, r: &TrialResult) {
        let wall_time = r.metrics.get("timestamp").copied().unwrap_or_else(crate::clock::now_unix);
        let prefix = &self.config.prefix;
        let value: Vec<proto::Value> = r
            .metrics
            .iter()
            .filter(|(k, v)| !NOT_SCALARS.contains(&k.as_str()) && v.is_finite())
            .map(|(k, v)| proto::Value { tag: format!("{prefix}{k}"), metadata: None, simple_value: Some(*v as f32) })
            .collect();
        let event =
            proto::Event { wall_time, step: r.training_iteration as i64, what: Some(proto::What::Summary(proto::Summary { value })) };
        write_record(self.file(&r.trial_id, wall_time), &event);
    }

    fn exploited(&mut self, e: &crate::store::ExploitRecord) {
        let event = hparams_event(e.at, "_hparams_/session_start_info", hparams_start(&e.new_config, &e.trial_id, e.at));
        write_record(self.file(&e.trial_id, e.at), &event);
    }

    fn ended(&mut self, trial: &TrialRecord, status: i32) {
        let now = crate::clock::now_unix();
        let end = proto::HParamsPluginData {
            version: 0,
            data: Some(proto::HParamsData::SessionEndInfo(proto::SessionEndInfo { status, end_time_secs: trial.ended_at.unwrap_or(now) })),
        };
        write_record(self.file(&trial.id, now), &hparams_event(now, "_hparams_/session_end_info", end));
        // Its next run, if any, writes a file of its own.
        self.files.remove(&trial.id);
    }

    /// Hands what is buffered to the writer threads.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let writes = self.pending.drain().map(|(path, bytes)| FileWrite::AppendBytes { path, bytes }).collect();
        self.writer.get_or_insert_with(FileWriter::spawn).write(writes);
    }
}

impl Callback for TensorBoardLogger {
    fn on_event(&mut self, event: &Event) -> Result<(), CallbackError> {
        match event {
            Event::TrialStarted { trial, .. } => self.started(trial),
            Event::Result(r) => self.result(r),
            Event::Exploited(e) => self.exploited(e),
            Event::TrialCompleted(t) => self.ended(t, proto::STATUS_SUCCESS),
            Event::TrialErrored(t) => self.ended(t, proto::STATUS_FAILURE),
            // It runs again later, in a file of its own.
            Event::TrialPaused(t) | Event::TrialInterrupted(t) => self.ended(t, proto::STATUS_UNKNOWN),
            // Twice a second: what is written reaches the files.
            Event::Status(_) => self.flush(),
            _ => {}
        }
        Ok(())
    }

    /// Every record reaches its file before this returns.
    fn close(&mut self) -> Result<(), CallbackError> {
        self.flush();
        if let Some(w) = self.writer.take() {
            w.close_blocking();
        }
        Ok(())
    }

    fn name(&self) -> String {
        "tensorboard".into()
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = if ok { String::from_utf8_lossy(&buf[..end]).into_owned() } else { String::new() };
    if name.is_empty() {
        "localhost".into()
    } else {
        name.replace(['/', '.'], "_")
    }
}

/// The config, flattened (`model.width`), as HParams session start info.
fn hparams_start(config: &serde_json::Value, trial: &str, start: f64) -> proto::HParamsPluginData {
    use proto::Kind;
    let hparams: BTreeMap<String, proto::ProtoValue> = crate::text::leaves(config)
        .into_iter()
        .filter_map(|(k, v)| {
            let kind = match v {
                serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
                serde_json::Value::Bool(b) => Kind::BoolValue(*b),
                serde_json::Value::String(s) => Kind::StringValue(s.clone()),
                serde_json::Value::Null => return None,
                other => Kind::StringValue(other.to_string()),
            };
            Some((k, proto::ProtoValue { kind: Some(kind) }))
        })
        .collect();
    proto::HParamsPluginData {
        version: 0,
        data: Some(proto::HParamsData::SessionStartInfo(proto::SessionStartInfo {
            hparams,
            model_uri: String::new(),
            monitor_url: String::new(),
            group_name: trial.to_string(),
            start_time_secs: start,
        })),
    }
}

fn hparams_event(wall_time: f64, tag: &str, data: proto::HParamsPluginData) -> proto::Event {
    use prost::Message;
    let metadata =
        proto::SummaryMetadata { plugin_data: Some(proto::PluginData { plugin_name: "hparams".into(), content: data.encode_to_vec() }) };
    let value = vec![proto::Value { tag: tag.into(), metadata: Some(metadata), simple_value: None }];
    proto::Event { wall_time, step: 0, what: Some(proto::What::Summary(proto::Summary { value })) }
}

/// CRC32C, masked as TFRecord files store it.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its CRC, the record, its CRC.
fn write_record(buf: &mut Vec<u8>, event: &proto::Event) {
    use prost::Message;
    let data = event.encode_to_vec();
    let len = (data.len() as u64).to_le_bytes();
    buf.extend_from_slice(&len);
    buf.extend_from_slice(&masked_crc(&len).to_le_bytes());
    buf.extend_from_slice(&data);
    buf.extend_from_slice(&masked_crc(&data).to_le_bytes());
}

/// One event's step and its scalars (tag, value).
pub type Scalars = (i64, Vec<(String, f32)>);

/// Reads the events of a file this logger wrote (for tests and checks):
/// every record's CRCs are verified.
pub fn read_events(path: &Path) -> Result<Vec<Scalars>, CallbackError> {
    use prost::Message;
    let bytes = std::fs::read(path)?;
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let header = bytes.get(at..at + 12).ok_or("a record cut short")?;
        let len_bytes: [u8; 8] = header[..8].try_into()?;
        let crc: [u8; 4] = header[8..12].try_into()?;
        if masked_crc(&len_bytes) != u32::from_le_bytes(crc) {
            return Err(format!("{}: a record's length fails its CRC", path.display()).into());
        }
        let len = u64::from_le_bytes(len_bytes) as usize;
        let data = bytes.get(at + 12..at + 12 + len).ok_or("a record cut short")?;
        let crc: [u8; 4] = bytes.get(at + 12 + len..at + 16 + len).ok_or("a record cut short")?.try_into()?;
        if masked_crc(data) != u32::from_le_bytes(crc) {
            return Err(format!("{}: a record fails its CRC", path.display()).into());
        }
        let event = proto::Event::decode(data)?;
        if let Some(proto::What::Summary(s)) = event.what {
            out.push((event.step, s.value.into_iter().filter_map(|v| Some((v.tag, v.simple_value?))).collect()));
        }
        at += 16 + len;
    }
    Ok(out)
}

/// The messages of TensorFlow's `event.proto`, `summary.proto` and
/// TensorBoard's hparams `plugin_data.proto` that the logger writes, with
/// their field numbers.
#[allow(missing_docs, clippy::derive_partial_eq_without_eq, clippy::enum_variant_names)]
mod proto {
    use std::collections::BTreeMap;

    pub const STATUS_UNKNOWN: i32 = 0;
    pub const STATUS_SUCCESS: i32 = 1;
    pub const STATUS_FAILURE: i32 = 2;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        #[prost(double, tag = "1")]
        pub wall_time: f64,
        #[prost(int64, tag = "2")]
        pub step: i64,
        #[prost(oneof = "What", tags = "3, 5, 6")]
        pub what: Option<What>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum What {
        #[prost(string, tag = "3")]
        FileVersion(String),
        #[prost(message, tag = "5")]
        Summary(Summary),
        #[prost(message, tag = "6")]
        SessionLog(SessionLog),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionLog {
        /// START = 1.
        #[prost(int32, tag = "1")]
        pub status: i32,
        #[prost(string, tag = "2")]
        pub checkpoint_path: String,
        #[prost(string, tag = "3")]
        pub msg: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Summary {
        #[prost(message, repeated, tag = "1")]
        pub value: Vec<Value>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Value {
        #[prost(string, tag = "1")]
        pub tag: String,
        #[prost(message, optional, tag = "9")]
        pub metadata: Option<SummaryMetadata>,
        #[prost(float, optional, tag = "2")]
        pub simple_value: Option<f32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SummaryMetadata {
        #[prost(message, optional, tag = "1")]
        pub plugin_data: Option<PluginData>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PluginData {
        #[prost(string, tag = "1")]
        pub plugin_name: String,
        #[prost(bytes = "vec", tag = "2")]
        pub content: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HParamsPluginData {
        #[prost(int32, tag = "1")]
        pub version: i32,
        #[prost(oneof = "HParamsData", tags = "3, 4")]
        pub data: Option<HParamsData>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum HParamsData {
        #[prost(message, tag = "3")]
        SessionStartInfo(SessionStartInfo),
        #[prost(message, tag = "4")]
        SessionEndInfo(SessionEndInfo),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionStartInfo {
        #[prost(btree_map = "string, message", tag = "1")]
        pub hparams: BTreeMap<String, ProtoValue>,
        #[prost(string, tag = "2")]
        pub model_uri: String,
        #[prost(string, tag = "3")]
        pub monitor_url: String,
        #[prost(string, tag = "4")]
        pub group_name: String,
        #[prost(double, tag = "5")]
        pub start_time_secs: f64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SessionEndInfo {
        #[prost(int32, tag = "1")]
        pub status: i32,
        #[prost(double, tag = "2")]
        pub end_time_secs: f64,
    }

    /// `google.protobuf.Value`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProtoValue {
        #[prost(oneof = "Kind", tags = "2, 3, 4")]
        pub kind: Option<Kind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(double, tag = "2")]
        NumberValue(f64),
        #[prost(string, tag = "3")]
        StringValue(String),
        #[prost(bool, tag = "4")]
        BoolValue(bool),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_masked_crc_is_tensorflows() {
        // The CRC32C check value, masked as TensorFlow's crc32c::Mask does.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(masked_crc(b"123456789"), 0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn results_read_back_at_their_steps() {
        let dir = tempfile::tempdir().unwrap();
        let mut tb = TensorBoardLogger::new(dir.path(), TensorBoardConfig::default());
        let mut rec = TrialRecord::new("trial_00000".into(), 0, serde_json::json!({"lr": 0.1, "model": {"w": 4}, "opt": "adam"}), 1.0);
        tb.on_event(&Event::TrialStarted { trial: std::sync::Arc::new(rec.clone()), resumed: false }).unwrap();
        for i in 1..=5u64 {
            let metrics = [("loss".to_string(), 1.0 / i as f64), ("training_iteration".into(), i as f64)].into_iter().collect();
            let r = TrialResult { trial_id: rec.id.clone(), seq: i - 1, training_iteration: i, metrics, checkpoint: None, extra: None };
            tb.on_event(&Event::Result(std::sync::Arc::new(r))).unwrap();
        }
        rec.status = schedulers::TrialStatus::Terminated;
        tb.on_event(&Event::TrialCompleted(std::sync::Arc::new(rec))).unwrap();
        tb.close().unwrap();
        let files: Vec<_> = std::fs::read_dir(tb.run_dir("trial_00000")).unwrap().flatten().collect();
        assert_eq!(files.len(), 1);
        let events = read_events(&files[0].path()).unwrap();
        let scalars: Vec<(i64, f32)> =
            events.iter().flat_map(|(step, v)| v.iter().filter(|(t, _)| t == "loss").map(move |(_, x)| (*step, *x))).collect();
        assert_eq!(scalars, (1..=5).map(|i| (i as i64, 1.0 / i as f32)).collect::<Vec<_>>());
        assert!(events.iter().all(|(_, v)| v.iter().all(|(t, _)| t != "training_iteration")));
    }
}
