//! Types shared by every nestor crate: optimisation mode, metrics, results.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A trial's configuration: a JSON object (nested objects for nested configs).
pub type Config = serde_json::Value;

/// Metric name -> value. Non-finite values are legal and preserved; see
/// [`metrics_serde`] for how they are written.
pub type Metrics = BTreeMap<String, f64>;

/// Whether a metric is minimised or maximised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Smaller is better.
    #[default]
    Min,
    /// Larger is better.
    Max,
}

impl Mode {
    /// Maps a metric value to a score where larger is always better, with
    /// NaN mapped to negative infinity: a non-finite metric is never the best.
    pub fn score(self, value: f64) -> f64 {
        if value.is_nan() {
            return f64::NEG_INFINITY;
        }
        match self {
            Mode::Min => -value,
            Mode::Max => value,
        }
    }

    /// True when `a` is strictly better than `b` under this mode (NaN is worst).
    pub fn better(self, a: f64, b: f64) -> bool {
        self.score(a) > self.score(b)
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "min" => Ok(Mode::Min),
            "max" => Ok(Mode::Max),
            other => Err(format!("mode must be \"min\" or \"max\", not {other:?}")),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Min => "min",
            Mode::Max => "max",
        })
    }
}

/// One stored report of a trial: what schedulers, searchers and stoppers see.
///
/// `metrics` holds the user's metrics plus the automatic ones nestor adds, as
/// Ray Tune does: `training_iteration`, `time_this_iter_s`, `time_total_s`,
/// `timestamp`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialResult {
    /// The trial that reported.
    pub trial_id: String,
    /// Position of this result in the trial's stored series (0-based, never reused).
    pub seq: u64,
    /// 1-based iteration number of the trial's training.
    pub training_iteration: u64,
    /// All metrics, user's and automatic.
    #[serde(with = "metrics_serde")]
    pub metrics: Metrics,
    /// Path or URI of the checkpoint committed with this result, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// What the trainable reported that is not a number (strings, lists,
    /// nested tables), as a JSON object: kept with the result and in its
    /// exports, never a scheduler's metric (Ray keeps these in its results too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<serde_json::Value>,
}

impl TrialResult {
    /// The value of metric `name` (user or automatic), if reported.
    pub fn metric(&self, name: &str) -> Option<f64> {
        if name == "training_iteration" {
            return Some(self.training_iteration as f64);
        }
        self.metrics.get(name).copied()
    }

    /// Whether the trainable said it is finished (`done: true` in its
    /// report, Ray's flag): the trial ends TERMINATED with this result.
    pub fn done(&self) -> bool {
        self.extra.as_ref().and_then(|e| e.get("done")).and_then(serde_json::Value::as_bool).unwrap_or(false)
    }
}

/// Serde for [`Metrics`] that keeps non-finite values: JSON has no NaN or
/// infinity, so they are written as the strings `"NaN"`, `"Infinity"`,
/// `"-Infinity"` and read back as floats.
pub mod metrics_serde {
    use super::Metrics;
    use serde::de::{self, Deserializer, MapAccess, Visitor};
    use serde::ser::{SerializeMap, Serializer};

    /// Writes `metrics`, non-finite values as strings.
    pub fn serialize<S: Serializer>(metrics: &Metrics, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(metrics.len()))?;
        for (k, v) in metrics {
            if v.is_finite() {
                map.serialize_entry(k, v)?;
            } else if v.is_nan() {
                map.serialize_entry(k, "NaN")?;
            } else if *v > 0.0 {
                map.serialize_entry(k, "Infinity")?;
            } else {
                map.serialize_entry(k, "-Infinity")?;
            }
        }
        map.end()
    }

    /// `metrics` as a JSON value, written as [`serialize`] writes them.
    pub fn to_json(metrics: &Metrics) -> serde_json::Value {
        struct Ref<'a>(&'a Metrics);
        impl serde::Serialize for Ref<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                serialize(self.0, s)
            }
        }
        serde_json::to_value(Ref(metrics)).unwrap_or(serde_json::Value::Null)
    }

    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Num {
        F(f64),
        S(String),
    }

    /// Reads metrics written by [`serialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Metrics, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Metrics;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of metric names to numbers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Metrics, A::Error> {
                let mut out = Metrics::new();
                while let Some((k, v)) = access.next_entry::<String, Num>()? {
                    let v = match v {
                        Num::F(f) => f,
                        Num::S(s) => match s.as_str() {
                            "NaN" => f64::NAN,
                            "Infinity" => f64::INFINITY,
                            "-Infinity" => f64::NEG_INFINITY,
                            other => return Err(de::Error::custom(format!("metric `{k}`: expected a number, got {other:?}"))),
                        },
                    };
                    out.insert(k, v);
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_metrics_round_trip_through_json() {
        let r = TrialResult {
            extra: None,
            trial_id: "t".into(),
            seq: 3,
            training_iteration: 4,
            metrics: [("a".to_string(), f64::NAN), ("b".into(), f64::INFINITY), ("c".into(), f64::NEG_INFINITY), ("d".into(), 0.5)]
                .into_iter()
                .collect(),
            checkpoint: None,
        };
        let text = serde_json::to_string(&r).unwrap();
        let back: TrialResult = serde_json::from_str(&text).unwrap();
        assert!(back.metrics["a"].is_nan());
        assert_eq!(back.metrics["b"], f64::INFINITY);
        assert_eq!(back.metrics["c"], f64::NEG_INFINITY);
        assert_eq!(back.metrics["d"], 0.5);
        assert_eq!(back.seq, 3);
        // The JSON value says the same as the serializer.
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(metrics_serde::to_json(&r.metrics), value["metrics"]);
    }

    #[test]
    fn nan_is_never_better() {
        assert!(Mode::Min.better(1.0, f64::NAN));
        assert!(!Mode::Min.better(f64::NAN, 1.0));
        assert!(Mode::Max.better(1.0, f64::NAN));
        assert!(Mode::Max.better(2.0, 1.0));
        assert!(Mode::Min.better(1.0, 2.0));
    }
}
