//! Search spaces: a tree of named domains and nested configs, built in Rust
//! with [`SpaceBuilder`] or read from a TOML table, sampled with a seeded RNG.

use std::collections::BTreeMap;

use rand::Rng;
use serde_json::{Map, Value};

use crate::domain::Domain;
use crate::error::SpaceError;
use crate::types::Config;

/// One entry of a space: a domain, or a nested space (a nested config).
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// A parameter and the values it may take.
    Domain(Domain),
    /// A nested config.
    Nested(Space),
}

/// A validated search space. Parameters are kept in name order, which fixes
/// the order of sampling, so a seed gives the same configs everywhere.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Space {
    params: BTreeMap<String, Node>,
}

/// Builds a [`Space`] in Rust; [`SpaceBuilder::build`] validates it.
///
/// ```
/// use search::{Domain, Space};
/// let space = Space::builder()
///     .param("lr", Domain::loguniform(1e-4, 1e-1))
///     .param("batch_size", Domain::choice([32, 64, 128]))
///     .constant("epochs", 10)
///     .nested("model", Space::builder().param("width", Domain::qrandint(64, 512, 64)))
///     .build()
///     .unwrap();
/// assert_eq!(space.len(), 4);
/// ```
#[derive(Debug, Default)]
pub struct SpaceBuilder {
    params: Vec<(String, NodeSpec)>,
}

#[derive(Debug)]
enum NodeSpec {
    Domain(Domain),
    Nested(SpaceBuilder),
}

impl SpaceBuilder {
    /// Adds a parameter.
    pub fn param(mut self, name: impl Into<String>, domain: Domain) -> Self {
        self.params.push((name.into(), NodeSpec::Domain(domain)));
        self
    }
    /// Adds a constant.
    pub fn constant(self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.param(name, Domain::Const(value.into()))
    }
    /// Adds a nested config.
    pub fn nested(mut self, name: impl Into<String>, space: SpaceBuilder) -> Self {
        self.params.push((name.into(), NodeSpec::Nested(space)));
        self
    }
    /// Validates every domain and name; the error names the field and the rule.
    pub fn build(self) -> Result<Space, SpaceError> {
        let space = self.build_at("")?;
        let axes = space.grid_axes();
        let size = axes.iter().try_fold(1u64, |n, (_, v)| n.checked_mul(v.len() as u64).filter(|&n| n <= MAX_GRID));
        match (size, axes.first()) {
            (None, Some((first, _))) => {
                let sizes: Vec<String> = axes.iter().map(|(name, v)| format!("{name}: {}", v.len())).collect();
                Err(SpaceError::new(
                    first.clone(),
                    format!(
                        "the grid has more than {MAX_GRID} combinations ({}), more than any sweep runs; sample some axes instead",
                        sizes.join(" x ")
                    ),
                ))
            }
            _ => Ok(space),
        }
    }

    fn build_at(self, prefix: &str) -> Result<Space, SpaceError> {
        let mut params = BTreeMap::new();
        for (name, spec) in self.params {
            let path = join(prefix, &name);
            check_name(&path, &name)?;
            let node = match spec {
                NodeSpec::Domain(d) => {
                    d.validate().map_err(|m| SpaceError::new(&path, m))?;
                    Node::Domain(d)
                }
                NodeSpec::Nested(b) => Node::Nested(b.build_at(&path)?),
            };
            if params.insert(name, node).is_some() {
                return Err(SpaceError::new(path, "defined twice"));
            }
        }
        Ok(Space { params })
    }
}

/// The most grid combinations a space may have (10^12).
pub const MAX_GRID: u64 = 1_000_000_000_000;

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

fn check_name(path: &str, name: &str) -> Result<(), SpaceError> {
    if name.is_empty() {
        return Err(SpaceError::new(path, "parameter names must not be empty"));
    }
    if name.contains('.') {
        return Err(SpaceError::new(path, "parameter names must not contain '.'; use a nested table"));
    }
    Ok(())
}

/// The domain names accepted in TOML: `name = { <kind> = [args] }`.
pub const DOMAIN_KINDS: &[&str] = &[
    "uniform",
    "quniform",
    "loguniform",
    "qloguniform",
    "randn",
    "qrandn",
    "randint",
    "qrandint",
    "lograndint",
    "qlograndint",
    "choice",
    "grid",
];

impl Space {
    /// Starts a builder.
    pub fn builder() -> SpaceBuilder {
        SpaceBuilder::default()
    }

    /// Number of top-level entries.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// True when the space has no parameters.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// The entries, in name order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.params.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Reads a space from a TOML table (the `[space]` section).
    ///
    /// `name = { <kind> = [args] }` with one of [`DOMAIN_KINDS`] is a domain;
    /// any other table is a nested config; any other value is a constant.
    pub fn from_toml(table: &toml::Table) -> Result<Space, SpaceError> {
        builder_from_toml(table, "")?.build()
    }

    /// Parses TOML text holding just a space's entries.
    pub fn from_toml_str(text: &str) -> Result<Space, SpaceError> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| SpaceError::new("<toml>", e.to_string()))?;
        Space::from_toml(&table)
    }

    /// The grid axes in sampling order: dotted path and values.
    pub fn grid_axes(&self) -> Vec<(String, &[Value])> {
        let mut out = Vec::new();
        self.collect_grid("", &mut out);
        out
    }

    fn collect_grid<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a [Value])>) {
        for (name, node) in &self.params {
            match node {
                Node::Domain(Domain::Grid(v)) => out.push((join(prefix, name), v.as_slice())),
                Node::Domain(_) => {}
                Node::Nested(s) => s.collect_grid(&join(prefix, name), out),
            }
        }
    }

    /// Number of grid combinations (1 when the space has no grid axis).
    pub fn grid_size(&self) -> u64 {
        self.grid_axes().iter().map(|(_, v)| v.len() as u64).product()
    }

    /// Samples one config: random domains from `rng`, grid axes set to grid
    /// combination `grid_index` (the first axis varies slowest).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R, grid_index: u64) -> Config {
        let lens: Vec<u64> = self.grid_axes().iter().map(|(_, v)| v.len() as u64).collect();
        let mut digits = vec![0usize; lens.len()];
        let mut rest = grid_index;
        for (d, len) in digits.iter_mut().zip(&lens).rev() {
            *d = (rest % len) as usize;
            rest /= len;
        }
        let mut cursor = digits.into_iter();
        self.sample_walk(rng, &mut cursor)
    }

    fn sample_walk<R: Rng + ?Sized>(&self, rng: &mut R, grid: &mut impl Iterator<Item = usize>) -> Config {
        let mut map = Map::new();
        for (name, node) in &self.params {
            let v = match node {
                Node::Domain(Domain::Grid(values)) => values[grid.next().unwrap_or(0)].clone(),
                Node::Domain(d) => d.sample(rng),
                Node::Nested(s) => s.sample_walk(rng, grid),
            };
            map.insert(name.clone(), v);
        }
        Value::Object(map)
    }

    /// Checks a given config (e.g. one of `points_to_evaluate`, possibly
    /// partial): every key must be a parameter and every value in its domain.
    pub fn check_point(&self, point: &Value, path: &str) -> Result<(), SpaceError> {
        let Some(obj) = point.as_object() else {
            return Err(SpaceError::new(path, "must be a table of parameter values"));
        };
        for (k, v) in obj {
            let p = format!("{path}.{k}");
            match self.params.get(k) {
                None => return Err(SpaceError::new(p, "not a parameter of the space")),
                Some(Node::Nested(s)) => s.check_point(v, &p)?,
                Some(Node::Domain(d)) => {
                    if !d.contains(v) {
                        return Err(SpaceError::new(p, format!("{v} is outside {}", d.describe())));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Writes `point`'s values over `config`, recursing into nested tables.
pub(crate) fn merge(config: &mut Value, point: &Value) {
    match (config, point) {
        (Value::Object(c), Value::Object(p)) => {
            for (k, v) in p {
                match c.get_mut(k) {
                    Some(slot @ Value::Object(_)) if v.is_object() => merge(slot, v),
                    _ => {
                        c.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (c, p) => *c = p.clone(),
    }
}

/// Converts TOML to JSON (datetimes become strings).
pub fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        toml::Value::Boolean(b) => Value::Bool(*b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(a.iter().map(toml_to_json).collect()),
        toml::Value::Table(t) => Value::Object(t.iter().map(|(k, v)| (k.clone(), toml_to_json(v))).collect()),
    }
}

fn builder_from_toml(table: &toml::Table, prefix: &str) -> Result<SpaceBuilder, SpaceError> {
    let mut b = SpaceBuilder::default();
    for (name, value) in table {
        let path = join(prefix, name);
        match value {
            toml::Value::Table(t) if t.len() == 1 && DOMAIN_KINDS.contains(&t.keys().next().map(String::as_str).unwrap_or("")) => {
                let (kind, args) = t.iter().next().ok_or_else(|| SpaceError::new(&path, "empty domain"))?;
                b = b.param(name, domain_from_toml(&path, kind, args)?);
            }
            toml::Value::Table(t) => b = b.nested(name, builder_from_toml(t, &path)?),
            other => b = b.constant(name, toml_to_json(other)),
        }
    }
    Ok(b)
}

fn domain_from_toml(path: &str, kind: &str, args: &toml::Value) -> Result<Domain, SpaceError> {
    let err = |m: String| SpaceError::new(path, m);
    let toml::Value::Array(a) = args else {
        return Err(err(format!("{kind} takes an array, e.g. {kind} = {}", usage(kind))));
    };
    let arity = |allowed: &[usize]| {
        if allowed.contains(&a.len()) {
            Ok(())
        } else {
            Err(err(format!("{kind} takes {}, got {} values", usage(kind), a.len())))
        }
    };
    let f = |i: usize, name: &str| -> Result<f64, SpaceError> {
        match &a[i] {
            toml::Value::Float(x) => Ok(*x),
            toml::Value::Integer(x) => Ok(*x as f64),
            other => Err(err(format!("{kind} {name} must be a number, got {}", other.type_str()))),
        }
    };
    let int = |i: usize, name: &str| -> Result<i64, SpaceError> {
        match &a[i] {
            toml::Value::Integer(x) => Ok(*x),
            other => Err(err(format!("{kind} {name} must be an integer, got {other}"))),
        }
    };
    let base_at = |i: usize| if a.len() > i { f(i, "base") } else { Ok(10.0) };
    Ok(match kind {
        "uniform" => {
            arity(&[2])?;
            Domain::uniform(f(0, "low")?, f(1, "high")?)
        }
        "quniform" => {
            arity(&[3])?;
            Domain::quniform(f(0, "low")?, f(1, "high")?, f(2, "q")?)
        }
        "loguniform" => {
            arity(&[2, 3])?;
            Domain::LogUniform { low: f(0, "low")?, high: f(1, "high")?, base: base_at(2)? }
        }
        "qloguniform" => {
            arity(&[3, 4])?;
            Domain::QLogUniform { low: f(0, "low")?, high: f(1, "high")?, q: f(2, "q")?, base: base_at(3)? }
        }
        "randn" => {
            arity(&[0, 1, 2])?;
            let mean = if a.is_empty() { 0.0 } else { f(0, "mean")? };
            let sd = if a.len() > 1 { f(1, "sd")? } else { 1.0 };
            Domain::randn(mean, sd)
        }
        "qrandn" => {
            arity(&[3])?;
            Domain::qrandn(f(0, "mean")?, f(1, "sd")?, f(2, "q")?)
        }
        "randint" => {
            arity(&[2])?;
            Domain::randint(int(0, "low")?, int(1, "high")?)
        }
        "qrandint" => {
            arity(&[2, 3])?;
            let q = if a.len() > 2 { int(2, "q")? } else { 1 };
            Domain::qrandint(int(0, "low")?, int(1, "high")?, q)
        }
        "lograndint" => {
            arity(&[2, 3])?;
            Domain::LogRandInt { low: int(0, "low")?, high: int(1, "high")?, base: base_at(2)? }
        }
        "qlograndint" => {
            arity(&[3, 4])?;
            Domain::QLogRandInt { low: int(0, "low")?, high: int(1, "high")?, q: int(2, "q")?, base: base_at(3)? }
        }
        "choice" => Domain::Choice(a.iter().map(toml_to_json).collect()),
        "grid" => Domain::Grid(a.iter().map(toml_to_json).collect()),
        other => return Err(err(format!("unknown domain `{other}`"))),
    })
}

fn usage(kind: &str) -> &'static str {
    match kind {
        "uniform" => "[low, high]",
        "quniform" => "[low, high, q]",
        "loguniform" | "lograndint" => "[low, high] or [low, high, base]",
        "qloguniform" | "qlograndint" => "[low, high, q] or [low, high, q, base]",
        "randn" => "[mean, sd]",
        "qrandn" => "[mean, sd, q]",
        "randint" => "[low, high]",
        "qrandint" => "[low, high] or [low, high, q]",
        _ => "[value, ...]",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const TOML: &str = r#"
lr = { loguniform = [1e-5, 1e-1] }
batch_size = { choice = [32, 64, 128] }
dropout = { uniform = [0.0, 0.5] }
layers = { randint = [1, 6] }
optimizer = { grid = ["adam", "sgd"] }
epochs = 20
act = { choice = [{ name = "relu" }, { name = "gelu", approx = true }] }
[model]
width = { qrandint = [64, 1024, 64] }
depth = { grid = [1, 2, 3] }
"#;

    #[test]
    fn toml_space_parses_every_kind_and_nests() {
        let s = Space::from_toml_str(TOML).unwrap();
        assert_eq!(s.len(), 8);
        assert_eq!(s.grid_size(), 6);
        // 10^20 combinations: refused by name, never wrapped around.
        let axis = || Domain::Grid((0..100).map(|i| serde_json::json!(i)).collect());
        let huge = (0..10).fold(Space::builder(), |b, i| b.param(format!("p{i}"), axis())).build().unwrap_err();
        assert_eq!(huge.path, "p0");
        assert!(huge.to_string().contains("more than 1000000000000 combinations (p0: 100 x p1: 100"), "{huge}");
        let axes: Vec<String> = s.grid_axes().into_iter().map(|(p, _)| p).collect();
        assert_eq!(axes, ["model.depth", "optimizer"]);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let c = s.sample(&mut rng, 5);
        assert_eq!(c["epochs"], 20);
        assert_eq!(c["model"]["depth"], 3);
        assert_eq!(c["optimizer"], "sgd");
        assert!(c["model"]["width"].as_i64().unwrap() % 64 == 0);
        assert!(c["act"].is_object());
    }

    #[test]
    fn invalid_toml_spaces_name_field_and_rule() {
        let e = |t: &str| Space::from_toml_str(t).unwrap_err().to_string();
        assert_eq!(e("lr = { loguniform = [0.0, 1.0] }"), "lr: loguniform low must be > 0, got 0");
        assert_eq!(e("batch = { choice = [] }"), "batch: choice needs at least one value");
        assert_eq!(e("x = { uniform = [1.0, 0.5] }"), "x: uniform low 1.0 > high 0.5");
        assert_eq!(e("[m]\nw = { randint = [1.5, 3] }"), "m.w: randint low must be an integer, got 1.5");
        assert_eq!(e("x = { uniform = [1.0] }"), "x: uniform takes [low, high], got 1 values");
        assert_eq!(e("x = { uniform = 1.0 }"), "x: uniform takes an array, e.g. uniform = [low, high]");
        assert_eq!(e("x = { uniform = [\"a\", 1] }"), "x: uniform low must be a number, got string");
    }

    #[test]
    fn builder_and_toml_agree() {
        let a = Space::builder()
            .param("lr", Domain::loguniform(1e-5, 1e-1))
            .nested("model", Space::builder().param("width", Domain::qrandint(64, 1024, 64)))
            .constant("epochs", 20)
            .build()
            .unwrap();
        let b = Space::from_toml_str("lr = { loguniform = [1e-5, 1e-1] }\nepochs = 20\n[model]\nwidth = { qrandint = [64, 1024, 64] }")
            .unwrap();
        assert_eq!(a, b);
        let e = Space::builder().param("a", Domain::randint(0, 1)).param("a", Domain::randint(0, 2)).build();
        assert_eq!(e.unwrap_err().to_string(), "a: defined twice");
    }

    #[test]
    fn points_are_checked_against_the_space() {
        let s = Space::from_toml_str(TOML).unwrap();
        let ok = serde_json::json!({"lr": 0.01, "model": {"width": 128}});
        s.check_point(&ok, "points_to_evaluate[0]").unwrap();
        let bad = serde_json::json!({"lr": 2.0});
        assert_eq!(
            s.check_point(&bad, "points_to_evaluate[1]").unwrap_err().to_string(),
            "points_to_evaluate[1].lr: 2.0 is outside loguniform [0.00001, 0.1]"
        );
        let unknown = serde_json::json!({"model": {"height": 1}});
        assert_eq!(s.check_point(&unknown, "p").unwrap_err().to_string(), "p.model.height: not a parameter of the space");
    }
}

/// Converts JSON to TOML; `null` has no TOML form and becomes the string "null".
pub fn json_to_toml(v: &Value) -> toml::Value {
    match v {
        Value::Null => toml::Value::String("null".into()),
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => toml::Value::String(s.clone()),
        Value::Array(a) => toml::Value::Array(a.iter().map(json_to_toml).collect()),
        Value::Object(o) => toml::Value::Table(o.iter().map(|(k, v)| (k.clone(), json_to_toml(v))).collect()),
    }
}

impl Space {
    /// The space in its TOML form (what [`Space::from_toml`] reads back).
    pub fn to_toml(&self) -> toml::Table {
        let mut t = toml::Table::new();
        for (name, node) in &self.params {
            let v = match node {
                Node::Nested(s) => toml::Value::Table(s.to_toml()),
                Node::Domain(d) => domain_to_toml(d),
            };
            t.insert(name.clone(), v);
        }
        t
    }
}

fn domain_to_toml(d: &Domain) -> toml::Value {
    use toml::Value as T;
    let f = T::Float;
    let i = T::Integer;
    let args: Vec<T> = match *d {
        Domain::Uniform { low, high } => vec![f(low), f(high)],
        Domain::QUniform { low, high, q } => vec![f(low), f(high), f(q)],
        Domain::LogUniform { low, high, base } => vec![f(low), f(high), f(base)],
        Domain::QLogUniform { low, high, q, base } => vec![f(low), f(high), f(q), f(base)],
        Domain::Randn { mean, sd } => vec![f(mean), f(sd)],
        Domain::QRandn { mean, sd, q } => vec![f(mean), f(sd), f(q)],
        Domain::RandInt { low, high } => vec![i(low), i(high)],
        Domain::QRandInt { low, high, q } => vec![i(low), i(high), i(q)],
        Domain::LogRandInt { low, high, base } => vec![i(low), i(high), f(base)],
        Domain::QLogRandInt { low, high, q, base } => vec![i(low), i(high), i(q), f(base)],
        Domain::Choice(ref v) | Domain::Grid(ref v) => v.iter().map(json_to_toml).collect(),
        Domain::Const(ref v) => return json_to_toml(v),
    };
    let mut t = toml::Table::new();
    t.insert(d.kind().to_string(), T::Array(args));
    T::Table(t)
}

#[cfg(test)]
mod to_toml_tests {
    use super::*;

    #[test]
    fn every_domain_survives_a_toml_round_trip() {
        let s = Space::builder()
            .param("a", Domain::uniform(0.0, 1.0))
            .param("b", Domain::quniform(0.0, 1.0, 0.1))
            .param("c", Domain::loguniform(1e-5, 1e-1))
            .param("d", Domain::qloguniform(1.0, 100.0, 5.0))
            .param("e", Domain::randn(0.0, 2.0))
            .param("f", Domain::qrandn(0.0, 2.0, 0.5))
            .param("g", Domain::randint(0, 10))
            .param("h", Domain::qrandint(0, 10, 2))
            .param("i", Domain::lograndint(1, 100))
            .param("j", Domain::qlograndint(1, 100, 3))
            .param("k", Domain::choice([serde_json::json!({"x": 1}), serde_json::json!("y")]))
            .param("l", Domain::grid([1, 2]))
            .constant("m", "const")
            .nested("n", Space::builder().param("o", Domain::randint(1, 2)))
            .build()
            .unwrap();
        assert_eq!(Space::from_toml(&s.to_toml()).unwrap(), s);
    }
}
