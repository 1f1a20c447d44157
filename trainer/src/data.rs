//! Data sets a trial's ranks read, split between them (`[datasets]` in an
//! experiment file): the section's types, the plan file, and the seam the
//! driver plans them through.
//!
//! The driver plans each data set once, before any trial runs
//! ([`plan_all`]): it expands a file, directory or glob (local, or an
//! object-store URL with the settings checkpoints use), reads the Parquet
//! footers for their row groups, counts the rows of CSV and JSON files, and
//! refuses a missing or unreadable file, or one whose columns differ from
//! the first's, by name. The plan (the blocks and their row counts) is
//! written to the experiment directory as `datasets.json`, the file every
//! rank reads (or fetches from the driver: `Context::dataset_plan`) and the
//! Python client reads too. Each rank then computes its own share of every
//! epoch with [`crate::split::share`], and reads it.
//!
//! Planning and reading need Arrow's readers, which live in the crate
//! nestor-data: it installs its [`Planner`] here (`data::install()`, which
//! the `nestor` binary calls), so that this crate and nestor-tuner build
//! the same with it or without. A program without one refuses a
//! `[datasets]` section by name.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The plan's file in the experiment directory.
pub const PLAN_FILE: &str = "datasets.json";
/// The plan file's format version.
pub const PLAN_VERSION: u32 = 1;

/// How a data set's files are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Parquet: each row group is a block.
    Parquet,
    /// CSV with a header row: each file is a block.
    Csv,
    /// Newline-delimited JSON: each file is a block.
    Json,
}

impl Format {
    /// The file name endings of the format (a directory's files of it).
    pub fn suffixes(self) -> &'static [&'static str] {
        match self {
            Self::Parquet => &[".parquet", ".pq"],
            Self::Csv => &[".csv"],
            Self::Json => &[".json", ".jsonl"],
        }
    }

    /// The format a path's ending names, if any.
    pub fn of_path(path: &str) -> Option<Self> {
        let path = path.trim_end_matches('/');
        [Self::Parquet, Self::Csv, Self::Json].into_iter().find(|f| f.suffixes().iter().any(|s| path.ends_with(s)))
    }

    /// Its name in a plan and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Csv => "csv",
            Self::Json => "json",
        }
    }
}

/// One or several paths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Paths {
    /// A file, a directory, a glob or an object-store URL.
    One(String),
    /// Several of them, read in order.
    Many(Vec<String>),
}

impl Paths {
    /// The paths, in order.
    pub fn list(&self) -> Vec<&str> {
        match self {
            Self::One(p) => vec![p.as_str()],
            Self::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// One entry of `[datasets]`: `train = "data/train/*.parquet"`, or the
/// table form `train = { path = ..., format = "csv", shuffle = true,
/// split = true, seed = 7 }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum DatasetSpec {
    /// A path (file, directory, glob, object-store URL), or several.
    Path(Paths),
    /// The table form.
    Table(DatasetTable),
}

/// The table form of a `[datasets]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetTable {
    /// A file, a directory (its files of the format), a glob, or an
    /// object-store URL (`s3://bucket/prefix/`); or a list of them.
    pub path: Paths,
    /// `parquet`, `csv` or `json` (default: the paths' ending, else parquet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<Format>,
    /// A new seeded order of the blocks and of their rows every epoch.
    #[serde(default)]
    pub shuffle: bool,
    /// Split the rows between the ranks (default); `false`: every rank reads all.
    #[serde(default = "yes")]
    pub split: bool,
    /// The shuffle's seed (default: the experiment's seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

// By hand, so that a bad table names its key (`unknown field `shufle``)
// rather than "did not match any variant".
impl<'de> Deserialize<'de> for DatasetSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = DatasetSpec;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a path, a list of paths, or a table with `path` (and `format`, `shuffle`, `split`, `seed`)")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DatasetSpec, E> {
                Ok(DatasetSpec::Path(Paths::One(v.to_string())))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<DatasetSpec, A::Error> {
                let mut paths = Vec::new();
                while let Some(p) = seq.next_element::<String>()? {
                    paths.push(p);
                }
                Ok(DatasetSpec::Path(Paths::Many(paths)))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<DatasetSpec, A::Error> {
                DatasetTable::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(DatasetSpec::Table)
            }
        }
        d.deserialize_any(Visit)
    }
}

fn yes() -> bool {
    true
}

impl DatasetSpec {
    /// The table form of any entry.
    pub fn table(&self) -> DatasetTable {
        match self {
            Self::Path(p) => DatasetTable { path: p.clone(), format: None, shuffle: false, split: true, seed: None },
            Self::Table(t) => t.clone(),
        }
    }

    /// What is wrong with the entry, before anything is read.
    pub fn check(&self) -> Result<(), String> {
        let t = self.table();
        let paths = t.path.list();
        if paths.is_empty() || paths.iter().any(|p| p.trim().is_empty()) {
            return Err("path: give a file, a directory, a glob or an object-store URL".into());
        }
        if t.format.is_none() {
            let formats: Vec<Format> = paths.iter().filter_map(|p| Format::of_path(p)).collect();
            if formats.windows(2).any(|w| w[0] != w[1]) {
                return Err("path: files of different formats; give one data set per format, or `format`".into());
            }
        }
        Ok(())
    }

    /// The format the entry is read in.
    pub fn format(&self) -> Format {
        let t = self.table();
        t.format.or_else(|| t.path.list().iter().find_map(|p| Format::of_path(p))).unwrap_or(Format::Parquet)
    }
}

/// A unit of reading: a Parquet row group, or a whole CSV or JSON file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// An absolute local path, or an object-store URL.
    pub path: String,
    /// How it is read.
    pub format: Format,
    /// Its number of rows.
    pub rows: u64,
    /// The row group (Parquet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_group: Option<usize>,
    /// A CSV or JSON file's columns as the driver found them (name, and
    /// Arrow's type as Arrow writes it), so that a rank parses the file
    /// without a first pass to find them again; empty: the rank finds them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<(String, String)>,
}

/// A data set as planned by the driver: what every rank needs to read its share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataPlan {
    /// The blocks, in order.
    pub blocks: Vec<Block>,
    /// A new seeded order every epoch.
    pub shuffle: bool,
    /// The orders' seed.
    pub seed: u64,
    /// Split between the ranks (else every rank reads all).
    pub split: bool,
}

impl DataPlan {
    /// Its number of rows.
    pub fn rows(&self) -> u64 {
        self.blocks.iter().map(|b| b.rows).sum()
    }
}

/// The plan file: every data set of the experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataPlans {
    /// [`PLAN_VERSION`].
    pub version: u32,
    /// By name.
    pub datasets: BTreeMap<String, DataPlan>,
}

/// Why a data set cannot be planned or read.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A data set's entry or one of its files is refused (named).
    #[error("datasets.{name}: {message}")]
    Refused {
        /// The data set.
        name: String,
        /// What is wrong, naming the file.
        message: String,
    },
    /// The plan file cannot be read.
    #[error("the data sets' plan {path}: {message}")]
    Plan {
        /// The plan file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// No such data set in the plan.
    #[error("dataset_shard({name:?}): the experiment's [datasets] has no such data set (it has {known})")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: String,
    },
    /// Reading a block failed.
    #[error("reading {path}: {message}")]
    Read {
        /// The block's file.
        path: String,
        /// What failed.
        message: String,
    },
    /// No planner is installed: the program leaves out nestor-data.
    #[error("data sets need nestor-data's readers, which this program leaves out (the `nestor` binary has them; a Rust program adds the crate nestor-data and calls `data::install()` before it tunes)")]
    NotBuilt,
}

/// Reads a plan file (`datasets.json`).
pub fn read_plans(path: &Path) -> Result<DataPlans, DataError> {
    let bad = |message: String| DataError::Plan { path: path.to_path_buf(), message };
    let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let plans: DataPlans = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    if plans.version != PLAN_VERSION {
        return Err(bad(format!("written by another nestor version (plan version {}, expected {PLAN_VERSION})", plans.version)));
    }
    Ok(plans)
}

/// A planning in progress ([`Planner::plan`]).
pub type Planning<'a> = Pin<Box<dyn Future<Output = Result<DataPlans, DataError>> + Send + 'a>>;

/// What plans `[datasets]` for the driver: nestor-data's, on Arrow's
/// readers, installed with [`install_planner`].
pub trait Planner: Send + Sync {
    /// Every data set of `specs` checked and planned; `seed` is the
    /// experiment's (a data set's own wins).
    fn plan<'a>(&'a self, specs: &'a BTreeMap<String, DatasetSpec>, seed: u64) -> Planning<'a>;
}

static PLANNER: OnceLock<Box<dyn Planner>> = OnceLock::new();

/// Installs the process's planner; the first one installed stays (it
/// returns whether this one was).
pub fn install_planner(planner: Box<dyn Planner>) -> bool {
    PLANNER.set(planner).is_ok()
}

/// Whether a planner is installed (a `[datasets]` section can be planned).
pub fn can_plan() -> bool {
    PLANNER.get().is_some()
}

/// Plans every data set of `[datasets]` with the installed planner;
/// [`DataError::NotBuilt`] without one.
pub async fn plan_all(specs: &BTreeMap<String, DatasetSpec>, seed: u64) -> Result<DataPlans, DataError> {
    match PLANNER.get() {
        Some(planner) => planner.plan(specs, seed).await,
        None => Err(DataError::NotBuilt),
    }
}
