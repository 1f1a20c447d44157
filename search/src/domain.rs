//! Domains: what one parameter of a search space may take, with Ray Tune's
//! primitives and semantics, validation, sampling and membership.

use rand::Rng;
use rand_distr::{Distribution, Normal};
use serde_json::Value;

/// The values one parameter may take.
///
/// Semantics follow Ray Tune: `randint` and `lograndint` exclude `high`; the
/// quantized integer domains (`qrandint`, `qlograndint`) include it; quantized
/// values are multiples of `q` and lie inside `[low, high]`.
#[derive(Debug, Clone, PartialEq)]
pub enum Domain {
    /// A float uniform in `[low, high)`.
    Uniform {
        /// Lower bound (inclusive).
        low: f64,
        /// Upper bound (exclusive).
        high: f64,
    },
    /// A float uniform in `[low, high]`, rounded to a multiple of `q`.
    QUniform {
        /// Lower bound.
        low: f64,
        /// Upper bound.
        high: f64,
        /// Quantum.
        q: f64,
    },
    /// A float whose logarithm is uniform in `[log low, log high)`.
    LogUniform {
        /// Lower bound, > 0.
        low: f64,
        /// Upper bound.
        high: f64,
        /// Logarithm base (10 by default; it does not change the distribution).
        base: f64,
    },
    /// A log-uniform float rounded to a multiple of `q`.
    QLogUniform {
        /// Lower bound, > 0.
        low: f64,
        /// Upper bound.
        high: f64,
        /// Quantum.
        q: f64,
        /// Logarithm base.
        base: f64,
    },
    /// A normally distributed float.
    Randn {
        /// Mean.
        mean: f64,
        /// Standard deviation, > 0.
        sd: f64,
    },
    /// A normally distributed float rounded to a multiple of `q`.
    QRandn {
        /// Mean.
        mean: f64,
        /// Standard deviation, > 0.
        sd: f64,
        /// Quantum.
        q: f64,
    },
    /// An integer uniform in `[low, high)`.
    RandInt {
        /// Lower bound (inclusive).
        low: i64,
        /// Upper bound (exclusive).
        high: i64,
    },
    /// An integer multiple of `q`, uniform over those in `[low, high]`.
    QRandInt {
        /// Lower bound (inclusive).
        low: i64,
        /// Upper bound (inclusive).
        high: i64,
        /// Quantum, > 0.
        q: i64,
    },
    /// An integer whose logarithm is uniform; in `[low, high)`.
    LogRandInt {
        /// Lower bound, > 0 (inclusive).
        low: i64,
        /// Upper bound (exclusive).
        high: i64,
        /// Logarithm base.
        base: f64,
    },
    /// A log-uniform integer rounded to a multiple of `q`; in `[low, high]`.
    QLogRandInt {
        /// Lower bound, > 0.
        low: i64,
        /// Upper bound (inclusive).
        high: i64,
        /// Quantum, > 0.
        q: i64,
        /// Logarithm base.
        base: f64,
    },
    /// One of the given values, uniformly; values may be any JSON, tables too.
    Choice(Vec<Value>),
    /// Grid search over the given values: every trial set gets each value.
    Grid(Vec<Value>),
    /// Always this value.
    Const(Value),
}

impl Domain {
    /// `uniform(low, high)`.
    pub fn uniform(low: f64, high: f64) -> Self {
        Domain::Uniform { low, high }
    }
    /// `quniform(low, high, q)`.
    pub fn quniform(low: f64, high: f64, q: f64) -> Self {
        Domain::QUniform { low, high, q }
    }
    /// `loguniform(low, high)`, base 10.
    pub fn loguniform(low: f64, high: f64) -> Self {
        Domain::LogUniform { low, high, base: 10.0 }
    }
    /// `qloguniform(low, high, q)`, base 10.
    pub fn qloguniform(low: f64, high: f64, q: f64) -> Self {
        Domain::QLogUniform { low, high, q, base: 10.0 }
    }
    /// `randn(mean, sd)`.
    pub fn randn(mean: f64, sd: f64) -> Self {
        Domain::Randn { mean, sd }
    }
    /// `qrandn(mean, sd, q)`.
    pub fn qrandn(mean: f64, sd: f64, q: f64) -> Self {
        Domain::QRandn { mean, sd, q }
    }
    /// `randint(low, high)`, high exclusive.
    pub fn randint(low: i64, high: i64) -> Self {
        Domain::RandInt { low, high }
    }
    /// `qrandint(low, high, q)`, high inclusive.
    pub fn qrandint(low: i64, high: i64, q: i64) -> Self {
        Domain::QRandInt { low, high, q }
    }
    /// `lograndint(low, high)`, high exclusive, base 10.
    pub fn lograndint(low: i64, high: i64) -> Self {
        Domain::LogRandInt { low, high, base: 10.0 }
    }
    /// `qlograndint(low, high, q)`, high inclusive, base 10.
    pub fn qlograndint(low: i64, high: i64, q: i64) -> Self {
        Domain::QLogRandInt { low, high, q, base: 10.0 }
    }
    /// `choice([...])`.
    pub fn choice<I, V>(values: I) -> Self
    where
        I: IntoIterator<Item = V>,
        V: Into<Value>,
    {
        Domain::Choice(values.into_iter().map(Into::into).collect())
    }
    /// `grid_search([...])`.
    pub fn grid<I, V>(values: I) -> Self
    where
        I: IntoIterator<Item = V>,
        V: Into<Value>,
    {
        Domain::Grid(values.into_iter().map(Into::into).collect())
    }
    /// A constant.
    pub fn constant(value: impl Into<Value>) -> Self {
        Domain::Const(value.into())
    }

    /// The name used in TOML and in error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Domain::Uniform { .. } => "uniform",
            Domain::QUniform { .. } => "quniform",
            Domain::LogUniform { .. } => "loguniform",
            Domain::QLogUniform { .. } => "qloguniform",
            Domain::Randn { .. } => "randn",
            Domain::QRandn { .. } => "qrandn",
            Domain::RandInt { .. } => "randint",
            Domain::QRandInt { .. } => "qrandint",
            Domain::LogRandInt { .. } => "lograndint",
            Domain::QLogRandInt { .. } => "qlograndint",
            Domain::Choice(_) => "choice",
            Domain::Grid(_) => "grid",
            Domain::Const(_) => "constant",
        }
    }

    /// Checks the domain's rules; the error message names the rule broken
    /// (the caller adds the field's path).
    pub fn validate(&self) -> Result<(), String> {
        let kind = self.kind();
        let finite = |name: &str, v: f64| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{kind} {name} must be finite, got {v}"))
            }
        };
        let ordered_f = |low: f64, high: f64, strict: bool| {
            finite("low", low)?;
            finite("high", high)?;
            if low > high {
                Err(format!("{kind} low {low:?} > high {high:?}"))
            } else if strict && low == high {
                Err(format!("{kind} low {low:?} >= high {high:?}"))
            } else {
                Ok(())
            }
        };
        let positive_q = |q: f64| {
            if q.is_finite() && q > 0.0 {
                Ok(())
            } else {
                Err(format!("{kind} q must be > 0, got {q}"))
            }
        };
        let base_ok = |base: f64| {
            if base.is_finite() && base > 0.0 && base != 1.0 {
                Ok(())
            } else {
                Err(format!("{kind} base must be > 0 and != 1, got {base}"))
            }
        };
        match *self {
            Domain::Uniform { low, high } => ordered_f(low, high, true),
            Domain::QUniform { low, high, q } => {
                ordered_f(low, high, false)?;
                positive_q(q)?;
                quantized_float_bounds(low, high, q).map(|_| ())
            }
            Domain::LogUniform { low, high, base } => {
                if low.is_nan() || low <= 0.0 {
                    return Err(format!("{kind} low must be > 0, got {low}"));
                }
                ordered_f(low, high, true)?;
                base_ok(base)
            }
            Domain::QLogUniform { low, high, q, base } => {
                if low.is_nan() || low <= 0.0 {
                    return Err(format!("{kind} low must be > 0, got {low}"));
                }
                ordered_f(low, high, false)?;
                positive_q(q)?;
                base_ok(base)?;
                quantized_float_bounds(low, high, q).map(|_| ())
            }
            Domain::Randn { mean, sd } => {
                finite("mean", mean)?;
                if sd.is_finite() && sd > 0.0 {
                    Ok(())
                } else {
                    Err(format!("{kind} sd must be > 0, got {sd}"))
                }
            }
            Domain::QRandn { mean, sd, q } => {
                Domain::Randn { mean, sd }.validate().map_err(|e| e.replacen("randn", "qrandn", 1))?;
                positive_q(q)?;
                // Where nearly every sample lies (40 sd), its multiples of q must be exact.
                quantized_float_bounds(mean - 20.0 * sd, mean + 20.0 * sd, q).map(|_| ()).map_err(|e| format!("{kind} {e}"))
            }
            Domain::RandInt { low, high } => {
                if low >= high {
                    Err(format!("{kind} low {low} >= high {high} (high is exclusive)"))
                } else {
                    Ok(())
                }
            }
            Domain::QRandInt { low, high, q } => {
                if q <= 0 {
                    return Err(format!("{kind} q must be > 0, got {q}"));
                }
                if low > high {
                    return Err(format!("{kind} low {low} > high {high}"));
                }
                quantized_int_bounds(low, high, q).map(|_| ())
            }
            Domain::LogRandInt { low, high, base } => {
                if low <= 0 {
                    return Err(format!("{kind} low must be > 0, got {low}"));
                }
                if low >= high {
                    return Err(format!("{kind} low {low} >= high {high} (high is exclusive)"));
                }
                base_ok(base)
            }
            Domain::QLogRandInt { low, high, q, base } => {
                if low <= 0 {
                    return Err(format!("{kind} low must be > 0, got {low}"));
                }
                if q <= 0 {
                    return Err(format!("{kind} q must be > 0, got {q}"));
                }
                if low > high {
                    return Err(format!("{kind} low {low} > high {high}"));
                }
                base_ok(base)?;
                quantized_int_bounds(low, high, q).map(|_| ())
            }
            Domain::Choice(ref v) if v.is_empty() => Err("choice needs at least one value".into()),
            Domain::Grid(ref v) if v.is_empty() => Err("grid needs at least one value".into()),
            Domain::Choice(_) | Domain::Grid(_) | Domain::Const(_) => Ok(()),
        }
    }

    /// Draws one value. Grid domains are expanded by the searcher, not sampled:
    /// here they yield their first value. The domain must be valid.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Value {
        match *self {
            Domain::Uniform { low, high } => float(rng.random_range(low..high)),
            Domain::QUniform { low, high, q } => {
                let x = rng.random_range(low..=high);
                float(quantize_float(x, low, high, q))
            }
            Domain::LogUniform { low, high, .. } => float(log_uniform(rng, low, high).min(high)),
            Domain::QLogUniform { low, high, q, .. } => {
                let x = log_uniform(rng, low, high);
                float(quantize_float(x, low, high, q))
            }
            Domain::Randn { mean, sd } => float(normal(rng, mean, sd)),
            Domain::QRandn { mean, sd, q } => {
                let x = normal(rng, mean, sd);
                float(round_to_q((x / q).round() * q, q))
            }
            Domain::RandInt { low, high } => Value::from(rng.random_range(low..high)),
            Domain::QRandInt { low, high, q } => {
                let (kl, kh) = quantized_int_bounds(low, high, q).unwrap_or((0, 0));
                Value::from(rng.random_range(kl..=kh) * q)
            }
            Domain::LogRandInt { low, high, .. } => {
                let x = log_uniform(rng, low as f64, high as f64).floor() as i64;
                Value::from(x.clamp(low, high - 1))
            }
            Domain::QLogRandInt { low, high, q, .. } => {
                let x = log_uniform(rng, low as f64, high as f64);
                let (kl, kh) = quantized_int_bounds(low, high, q).unwrap_or((0, 0));
                let k = ((x / q as f64).round() as i64).clamp(kl, kh);
                Value::from(k * q)
            }
            Domain::Choice(ref values) => values[rng.random_range(0..values.len())].clone(),
            Domain::Grid(ref values) => values.first().cloned().unwrap_or(Value::Null),
            Domain::Const(ref v) => v.clone(),
        }
    }

    /// For model-based searchers: the interval a numeric domain is modelled
    /// on (natural log of the value for log domains; randn domains are
    /// modelled on mean ± 4 sd), and whether it is log-scaled. `None` for
    /// choice, grid and constant domains.
    pub(crate) fn model_range(&self) -> Option<(f64, f64, bool)> {
        Some(match *self {
            Domain::Uniform { low, high } | Domain::QUniform { low, high, .. } => (low, high, false),
            Domain::LogUniform { low, high, .. } | Domain::QLogUniform { low, high, .. } => (low.ln(), high.ln(), true),
            Domain::Randn { mean, sd } | Domain::QRandn { mean, sd, .. } => (mean - 4.0 * sd, mean + 4.0 * sd, false),
            // Integers are modelled on a continuum whose rounding covers each value equally.
            Domain::RandInt { low, high } => (low as f64 - 0.5, high as f64 - 0.5, false),
            Domain::QRandInt { low, high, .. } => (low as f64, high as f64, false),
            Domain::LogRandInt { low, high, .. } => ((low as f64).ln(), (high as f64).ln(), true),
            Domain::QLogRandInt { low, high, .. } => ((low as f64).ln(), (high as f64).ln(), true),
            Domain::Choice(_) | Domain::Grid(_) | Domain::Const(_) => return None,
        })
    }

    /// The model-space coordinate of a value of this numeric domain.
    pub(crate) fn to_model(&self, value: &Value) -> Option<f64> {
        let (_, _, log) = self.model_range()?;
        let x = value.as_f64()?;
        Some(if log { x.max(f64::MIN_POSITIVE).ln() } else { x })
    }

    /// The domain value nearest to model-space coordinate `x`: clamped into
    /// the domain, rounded and quantized as it requires.
    pub(crate) fn value_at_model(&self, x: f64) -> Value {
        match *self {
            Domain::Uniform { low, high } => {
                let v = x.clamp(low, high);
                // `high` is excluded: the largest float below it.
                float(if v >= high { f64::from_bits(high.to_bits() - 1).max(low) } else { v })
            }
            Domain::QUniform { low, high, q } => float(quantize_float(x, low, high, q)),
            Domain::LogUniform { low, high, .. } => float(snap(x.exp(), low, high)),
            Domain::QLogUniform { low, high, q, .. } => float(quantize_float(x.exp(), low, high, q)),
            Domain::Randn { .. } => float(x),
            Domain::QRandn { q, .. } => float(round_to_q((x / q).round() * q, q)),
            Domain::RandInt { low, high } => Value::from((x.round() as i64).clamp(low, high - 1)),
            Domain::QRandInt { low, high, q } => {
                let (kl, kh) = quantized_int_bounds(low, high, q).unwrap_or((0, 0));
                Value::from(((x / q as f64).round() as i64).clamp(kl, kh) * q)
            }
            Domain::LogRandInt { low, high, .. } => Value::from((x.exp().floor() as i64).clamp(low, high - 1)),
            Domain::QLogRandInt { low, high, q, .. } => {
                let (kl, kh) = quantized_int_bounds(low, high, q).unwrap_or((0, 0));
                Value::from(((x.exp() / q as f64).round() as i64).clamp(kl, kh) * q)
            }
            Domain::Choice(ref v) | Domain::Grid(ref v) => v.first().cloned().unwrap_or(Value::Null),
            Domain::Const(ref v) => v.clone(),
        }
    }

    /// Where `value` lies in this bounded numeric domain, from 0 (its low
    /// end) to 1 (its high end), on the scale it is sampled on (log for log
    /// domains). `None` for unbounded, categorical and constant domains, and
    /// for a value that is not a number.
    pub fn to_unit(&self, value: &Value) -> Option<f64> {
        self.bounds()?;
        let (low, high, _) = self.model_range()?;
        let x = self.to_model(value)?;
        Some(if high > low { ((x - low) / (high - low)).clamp(0.0, 1.0) } else { 0.0 })
    }

    /// The value at `u` in `[0, 1]` of this bounded numeric domain (the
    /// inverse of [`Domain::to_unit`]), rounded and quantized as it requires.
    pub fn at_unit(&self, u: f64) -> Option<Value> {
        self.bounds()?;
        let (low, high, _) = self.model_range()?;
        u.is_finite().then(|| self.value_at_model(low + u.clamp(0.0, 1.0) * (high - low)))
    }

    /// Whether `value` is one this domain can produce (randn domains accept
    /// any finite number of the right kind).
    pub fn contains(&self, value: &Value) -> bool {
        let as_int = |v: &Value| v.as_i64();
        match *self {
            Domain::Uniform { low, high } => value.as_f64().is_some_and(|x| low <= x && x < high),
            Domain::LogUniform { low, high, .. } => value.as_f64().is_some_and(|x| low <= x && x <= high),
            Domain::QUniform { low, high, q } | Domain::QLogUniform { low, high, q, .. } => {
                value.as_f64().is_some_and(|x| low <= x && x <= high && is_multiple(x, q))
            }
            Domain::Randn { .. } => value.as_f64().is_some_and(f64::is_finite),
            Domain::QRandn { q, .. } => value.as_f64().is_some_and(|x| x.is_finite() && is_multiple(x, q)),
            Domain::RandInt { low, high } | Domain::LogRandInt { low, high, .. } => as_int(value).is_some_and(|x| low <= x && x < high),
            Domain::QRandInt { low, high, q } | Domain::QLogRandInt { low, high, q, .. } => {
                as_int(value).is_some_and(|x| low <= x && x <= high && x % q == 0)
            }
            Domain::Choice(ref v) | Domain::Grid(ref v) => v.contains(value),
            Domain::Const(ref v) => v == value,
        }
    }

    /// The value of this numeric domain nearest to `x`: clamped into its
    /// bounds, rounded to an integer or a multiple of `q` as it requires.
    /// `None` for categorical and constant domains, and for a non-finite `x`.
    pub fn nearest(&self, x: f64) -> Option<Value> {
        if !x.is_finite() {
            return None;
        }
        let int = |low: i64, high: i64| Value::from((x.round() as i64).clamp(low, high));
        let qint = |low: i64, high: i64, q: i64| {
            let (kl, kh) = quantized_int_bounds(low, high, q).unwrap_or((0, 0));
            Value::from(((x / q as f64).round() as i64).clamp(kl, kh) * q)
        };
        Some(match *self {
            Domain::Uniform { .. } | Domain::QUniform { .. } | Domain::Randn { .. } | Domain::QRandn { .. } => self.value_at_model(x),
            Domain::LogUniform { .. } | Domain::QLogUniform { .. } => self.value_at_model(x.max(f64::MIN_POSITIVE).ln()),
            Domain::RandInt { low, high } | Domain::LogRandInt { low, high, .. } => int(low, high - 1),
            Domain::QRandInt { low, high, q } | Domain::QLogRandInt { low, high, q, .. } => qint(low, high, q),
            Domain::Choice(_) | Domain::Grid(_) | Domain::Const(_) => return None,
        })
    }

    /// The bounds of a bounded numeric domain (`randn` has none), and
    /// whether its values are integers.
    pub fn bounds(&self) -> Option<(f64, f64, bool)> {
        Some(match *self {
            Domain::Uniform { low, high }
            | Domain::QUniform { low, high, .. }
            | Domain::LogUniform { low, high, .. }
            | Domain::QLogUniform { low, high, .. } => (low, high, false),
            Domain::RandInt { low, high } | Domain::LogRandInt { low, high, .. } => (low as f64, (high - 1) as f64, true),
            Domain::QRandInt { low, high, .. } | Domain::QLogRandInt { low, high, .. } => (low as f64, high as f64, true),
            Domain::Randn { .. } | Domain::QRandn { .. } | Domain::Choice(_) | Domain::Grid(_) | Domain::Const(_) => return None,
        })
    }

    /// A short human description, e.g. `loguniform [1e-5, 0.1]`.
    pub fn describe(&self) -> String {
        match self {
            Domain::Uniform { low, high } => format!("uniform [{low}, {high})"),
            Domain::QUniform { low, high, q } => format!("quniform [{low}, {high}] q={q}"),
            Domain::LogUniform { low, high, .. } => format!("loguniform [{low}, {high}]"),
            Domain::QLogUniform { low, high, q, .. } => format!("qloguniform [{low}, {high}] q={q}"),
            Domain::Randn { mean, sd } => format!("randn mean={mean} sd={sd}"),
            Domain::QRandn { mean, sd, q } => format!("qrandn mean={mean} sd={sd} q={q}"),
            Domain::RandInt { low, high } => format!("randint [{low}, {high})"),
            Domain::QRandInt { low, high, q } => format!("qrandint [{low}, {high}] q={q}"),
            Domain::LogRandInt { low, high, .. } => format!("lograndint [{low}, {high})"),
            Domain::QLogRandInt { low, high, q, .. } => format!("qlograndint [{low}, {high}] q={q}"),
            Domain::Choice(v) => format!("choice of {} values", v.len()),
            Domain::Grid(v) => format!("grid of {} values", v.len()),
            Domain::Const(v) => format!("constant {v}"),
        }
    }
}

fn float(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

fn log_uniform<R: Rng + ?Sized>(rng: &mut R, low: f64, high: f64) -> f64 {
    // The base cancels out: log_b(x) uniform <=> ln(x) uniform.
    rng.random_range(low.ln()..high.ln()).exp().max(low)
}

fn normal<R: Rng + ?Sized>(rng: &mut R, mean: f64, sd: f64) -> f64 {
    match Normal::new(mean, sd) {
        Ok(n) => n.sample(rng),
        Err(_) => mean,
    }
}

/// The largest `k` for which `k * q` is exact: 2^53.
const MAX_STEPS: f64 = 9_007_199_254_740_992.0;

/// Range of k such that k*q lies in [low, high]; an error when there is none.
fn quantized_float_bounds(low: f64, high: f64, q: f64) -> Result<(f64, f64), String> {
    let eps = 1e-9;
    let kl = (low / q - eps).ceil();
    let kh = (high / q + eps).floor();
    if !(kl.abs() <= MAX_STEPS && kh.abs() <= MAX_STEPS) {
        Err(format!(
            "q={q} is too small for [{low}, {high}]: its multiples there are more than 2^53 steps from 0, past a double's precision"
        ))
    } else if kl > kh {
        Err(format!("no multiple of q={q} lies in [{low}, {high}]"))
    } else {
        Ok((kl, kh))
    }
}

fn quantized_int_bounds(low: i64, high: i64, q: i64) -> Result<(i64, i64), String> {
    let kl = low.div_euclid(q) + i64::from(low.rem_euclid(q) != 0);
    let kh = high.div_euclid(q);
    if kl > kh {
        Err(format!("no multiple of q={q} lies in [{low}, {high}]"))
    } else {
        Ok((kl, kh))
    }
}

fn quantize_float(x: f64, low: f64, high: f64, q: f64) -> f64 {
    let (kl, kh) = quantized_float_bounds(low, high, q).unwrap_or((0.0, 0.0));
    let k = (x / q).round().clamp(kl, kh);
    round_to_q(k * q, q)
}

/// Removes binary noise from `k * q` (0.30000000000000004 -> 0.3) by rounding
/// to the number of decimals `q` itself has.
fn round_to_q(x: f64, q: f64) -> f64 {
    let text = format!("{q}");
    let decimals = text.split_once('.').map_or(0, |(_, d)| d.len());
    if decimals > 15 {
        // Finer than rounding can clean: rounding would lose the value.
        return x;
    }
    let decimals = decimals as i32;
    let scale = 10f64.powi(decimals);
    let r = (x * scale).round() / scale;
    if r == 0.0 {
        0.0
    } else {
        r
    }
}

fn is_multiple(x: f64, q: f64) -> bool {
    let k = (x / q).round();
    (k * q - x).abs() <= 1e-9 * q.abs().max(x.abs()).max(1.0)
}

/// `v` clamped into `[low, high]`, and the bound itself when `v` is a
/// rounding error away from it (`exp(ln(1e-4))` is not quite `1e-4`).
fn snap(v: f64, low: f64, high: f64) -> f64 {
    let near = |b: f64| (v - b).abs() <= 1e-12 * b.abs();
    if near(low) {
        low
    } else if near(high) {
        high
    } else {
        v.clamp(low, high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_clamps_rounds_and_quantizes() {
        use serde_json::json;
        assert_eq!(Domain::uniform(0.0, 1.0).nearest(0.5), Some(json!(0.5)));
        assert!(Domain::uniform(0.0, 1.0).nearest(3.0).and_then(|v| v.as_f64()).is_some_and(|x| x < 1.0 && x > 0.999));
        assert_eq!(Domain::loguniform(1e-4, 1e-1).nearest(1.0), Some(json!(0.1)));
        assert_eq!(Domain::loguniform(1e-4, 1e-1).nearest(-5.0), Some(json!(1e-4)));
        assert_eq!(Domain::quniform(0.0, 1.0, 0.25).nearest(0.4), Some(json!(0.5)));
        assert_eq!(Domain::randint(1, 10).nearest(11.2), Some(json!(9)));
        assert_eq!(Domain::lograndint(1, 100).nearest(4.6), Some(json!(5)));
        assert_eq!(Domain::qrandint(0, 64, 16).nearest(41.0), Some(json!(48)));
        assert_eq!(Domain::choice([1, 2]).nearest(1.0), None);
        assert_eq!(Domain::uniform(0.0, 1.0).nearest(f64::NAN), None);
        assert_eq!(Domain::randint(1, 10).bounds(), Some((1.0, 9.0, true)));
        assert_eq!(Domain::randn(0.0, 1.0).bounds(), None);
    }
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use serde_json::json;
    use statrs::distribution::{ContinuousCDF, Uniform as StUniform};

    fn domains() -> impl Strategy<Value = Domain> {
        let f = -1000.0f64..1000.0;
        let pos = 1e-6f64..1000.0;
        let q = prop_oneof![Just(0.1), Just(0.25), Just(1.0), Just(5.0), 0.01f64..10.0];
        let i = -1000i64..1000;
        prop_oneof![
            (f.clone(), 1e-3f64..100.0).prop_map(|(l, w)| Domain::uniform(l, l + w)),
            (f.clone(), 1e-3f64..100.0, q.clone()).prop_map(|(l, w, q)| Domain::quniform(l, l + w + q, q)),
            (pos.clone(), 1.001f64..1e4).prop_map(|(l, m)| Domain::loguniform(l, l * m)),
            (pos.clone(), 1.5f64..1e4, q.clone()).prop_map(|(l, m, q)| Domain::qloguniform(l, l * m + q, q)),
            (f.clone(), 1e-3f64..100.0).prop_map(|(m, s)| Domain::randn(m, s)),
            (f.clone(), 1e-3f64..100.0, q).prop_map(|(m, s, q)| Domain::qrandn(m, s, q)),
            (i.clone(), 1i64..500).prop_map(|(l, w)| Domain::randint(l, l + w)),
            (i.clone(), 0i64..500, 1i64..20).prop_map(|(l, w, q)| Domain::qrandint(l, l + w + q, q)),
            (1i64..1000, 1i64..10_000).prop_map(|(l, w)| Domain::lograndint(l, l + w)),
            (1i64..1000, 0i64..10_000, 1i64..20).prop_map(|(l, w, q)| Domain::qlograndint(l, l + w + q, q)),
            prop::collection::vec(any::<i32>(), 1..6).prop_map(Domain::choice),
        ]
    }

    proptest! {
        #[test]
        fn every_sample_lies_in_its_domain(d in domains(), seed in any::<u64>()) {
            prop_assert!(d.validate().is_ok(), "{d:?}: {:?}", d.validate());
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for _ in 0..50 {
                let v = d.sample(&mut rng);
                prop_assert!(d.contains(&v), "{v} not in {d:?}");
            }
        }

        #[test]
        fn quantized_values_are_multiples_of_q(low in -100.0f64..100.0, width in 0.0f64..50.0, qi in 1usize..6, seed in any::<u64>()) {
            let q = [0.1, 0.2, 0.25, 0.5, 2.0, 3.0][qi];
            let d = Domain::quniform(low, low + width + q, q);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for _ in 0..50 {
                let x = d.sample(&mut rng).as_f64().unwrap();
                prop_assert!(is_multiple(x, q), "{x} not a multiple of {q}");
                // The cleaned value is exactly the nearest multiple's decimal form.
                prop_assert_eq!(format!("{x}").len() <= 24, true);
            }
            let d = Domain::qrandint(low as i64, low as i64 + width as i64 + 3, 3);
            for _ in 0..50 {
                let x = d.sample(&mut rng).as_i64().unwrap();
                prop_assert_eq!(x % 3, 0);
            }
        }
    }

    #[test]
    fn log_domains_are_log_uniform() {
        // Kolmogorov-Smirnov: log10 of samples against Uniform(log10 low, log10 high).
        let (low, high) = (1e-5, 1e-1);
        let d = Domain::loguniform(low, high);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let n = 4000;
        let mut xs: Vec<f64> = (0..n).map(|_| d.sample(&mut rng).as_f64().unwrap().log10()).collect();
        xs.sort_by(f64::total_cmp);
        let u = StUniform::new(low.log10(), high.log10()).unwrap();
        let dstat = xs
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let c = u.cdf(x);
                (c - i as f64 / n as f64).abs().max(((i + 1) as f64 / n as f64 - c).abs())
            })
            .fold(0.0, f64::max);
        // Critical value at alpha = 0.01: 1.63 / sqrt(n).
        assert!(dstat < 1.63 / (n as f64).sqrt(), "KS statistic {dstat}");
        // And the raw values are far from uniform (a uniform sampler would fail the same test).
        let mut raw: Vec<f64> = (0..n).map(|_| d.sample(&mut rng).as_f64().unwrap()).collect();
        raw.sort_by(f64::total_cmp);
        let median = raw[n / 2];
        assert!(median < 0.01, "median {median} should be near 10^-3, not (high-low)/2");

        // lograndint too: log of samples roughly uniform in [ln 1, ln 1000).
        let d = Domain::lograndint(1, 1000);
        let below_10 = (0..n).filter(|_| d.sample(&mut rng).as_i64().unwrap() < 10).count() as f64 / n as f64;
        assert!((below_10 - 1.0 / 3.0).abs() < 0.03, "P(x < 10) = {below_10}, expected 1/3");
    }

    #[test]
    fn invalid_domains_name_the_rule() {
        assert_eq!(Domain::loguniform(0.0, 1.0).validate().unwrap_err(), "loguniform low must be > 0, got 0");
        assert_eq!(Domain::uniform(1.0, 0.5).validate().unwrap_err(), "uniform low 1.0 > high 0.5");
        assert_eq!(Domain::uniform(1.0, 1.0).validate().unwrap_err(), "uniform low 1.0 >= high 1.0");
        assert_eq!(Domain::Choice(vec![]).validate().unwrap_err(), "choice needs at least one value");
        assert!(Domain::randint(3, 3).validate().unwrap_err().contains("exclusive"));
        assert!(Domain::quniform(0.1, 0.2, 0.5).validate().unwrap_err().contains("no multiple"));
        // A q so small its multiples are past a double's precision (or infinite) is refused, never sampled as null.
        for d in [
            Domain::quniform(0.0, 1.0, 1e-300),
            Domain::quniform(0.0, 1.0, 5e-324),
            Domain::QLogUniform { low: 1e-3, high: 1.0, q: 1e-310, base: std::f64::consts::E },
            Domain::qrandn(0.0, 1.0, 1e-300),
        ] {
            assert!(d.validate().unwrap_err().contains("is too small for"), "{d:?}");
        }
        // Fine, but within precision: real values, not all rounded to 0.
        let fine = Domain::quniform(0.0, 1e-18, 1e-20);
        fine.validate().unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let xs: Vec<f64> = (0..50).map(|_| fine.sample(&mut rng).as_f64().unwrap()).collect();
        assert!(xs.iter().all(|x| x.is_finite() && (0.0..=1e-18).contains(x)) && xs.iter().any(|&x| x > 0.0), "{xs:?}");
        assert!(Domain::qrandint(0, 10, 0).validate().unwrap_err().contains("q must be > 0"));
        assert!(Domain::randn(0.0, -1.0).validate().unwrap_err().contains("sd must be > 0"));
    }

    #[test]
    fn randint_excludes_high_and_qrandint_includes_it() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let a: Vec<i64> = (0..500).map(|_| Domain::randint(0, 3).sample(&mut rng).as_i64().unwrap()).collect();
        assert!(a.iter().all(|&x| (0..3).contains(&x)));
        assert!(a.contains(&2));
        let b: Vec<i64> = (0..500).map(|_| Domain::qrandint(0, 12, 3).sample(&mut rng).as_i64().unwrap()).collect();
        assert!(b.contains(&12) && b.contains(&0));
    }

    #[test]
    fn the_unit_interval_maps_onto_bounded_domains_on_their_scale() {
        let lr = Domain::loguniform(1e-4, 0.1);
        assert_eq!(lr.at_unit(0.0), Some(json!(1e-4)));
        assert_eq!(lr.at_unit(1.0), Some(json!(0.1)));
        let mid = lr.at_unit(0.5).unwrap().as_f64().unwrap();
        assert!((mid - 10f64.powf(-2.5)).abs() < 1e-12, "{mid}");
        assert!((lr.to_unit(&json!(mid)).unwrap() - 0.5).abs() < 1e-12);
        let n = Domain::randint(2, 9);
        assert_eq!((n.at_unit(0.0), n.at_unit(1.0)), (Some(json!(2)), Some(json!(8))));
        assert!(n.to_unit(&json!(2)).unwrap() < n.to_unit(&json!(8)).unwrap());
        assert_eq!(Domain::uniform(0.0, 1.0).to_unit(&json!(5.0)), Some(1.0));
        assert_eq!(Domain::randn(0.0, 1.0).at_unit(0.5), None);
        assert_eq!(Domain::choice([1, 2]).to_unit(&json!(1)), None);
    }
}
