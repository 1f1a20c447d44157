//! How nestor writes numbers, configs, errors and checkpoints for people:
//! one place, so the console, `nestor status` and the dashboard agree.

/// `1 trial`, `3 trials`.
/// `url` as it may be shown or stored: a password in it (`user:pass@`)
/// replaced by `***`.
pub(crate) fn redact_url(url: &str) -> String {
    match split_userinfo(url) {
        (bare, Some((user, _))) => match bare.split_once("://") {
            Some((scheme, rest)) => format!("{scheme}://{user}:***@{rest}"),
            None => bare,
        },
        (_, None) => url.to_string(),
    }
}

/// `url` without its userinfo (`user[:password]@` before the host), and
/// that userinfo: an `@` in the path is not one.
pub(crate) fn split_userinfo(url: &str) -> (String, Option<(String, Option<String>)>) {
    let Some((scheme, rest)) = url.split_once("://") else { return (url.to_string(), None) };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((info, host)) => {
            let (user, password) = match info.split_once(':') {
                Some((u, p)) => (u.to_string(), Some(p.to_string())),
                None => (info.to_string(), None),
            };
            (format!("{scheme}://{host}{}", &rest[authority_end..]), Some((user, password)))
        }
        None => (url.to_string(), None),
    }
}

pub(crate) fn trials(n: impl Into<u64>) -> String {
    let n = n.into();
    format!("{n} trial{}", if n == 1 { "" } else { "s" })
}

/// A config's leaves, nested keys dotted (`model.width`), in key order.
pub(crate) fn leaves(config: &serde_json::Value) -> Vec<(String, &serde_json::Value)> {
    fn walk<'a>(prefix: &str, v: &'a serde_json::Value, out: &mut Vec<(String, &'a serde_json::Value)>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    walk(&if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") }, v, out);
                }
            }
            other => out.push((prefix.to_string(), other)),
        }
    }
    let mut out = Vec::new();
    walk("", config, &mut out);
    out
}

/// `lr=0.001 model.width=64`, shortened.
pub(crate) fn config_summary(config: &serde_json::Value) -> String {
    let shown: Vec<String> = leaves(config)
        .into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::Number(n) => format!("{k}={}", fmt_num(n.as_f64().unwrap_or(f64::NAN))),
            other => format!("{k}={other}"),
        })
        .collect();
    shown.join(" ")
}

/// Four significant digits, no noise.
pub(crate) fn fmt_num(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e9 {
        return format!("{x}");
    }
    if x != 0.0 && (x.abs() < 1e-3 || x.abs() >= 1e6) {
        return format!("{x:.3e}");
    }
    let s = format!("{x:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// A trial's error or failure in one line: its first line, with a log tail's
/// header shortened to where the log is (`...; log: .../rank-0.log`).
pub(crate) fn headline(message: &str) -> String {
    let first = message.lines().next().unwrap_or_default();
    match first.split_once("; last log lines (") {
        Some((what, rest)) => format!("{what}; log: {}", rest.trim_end_matches(':').trim_end_matches(')')),
        None => first.to_string(),
    }
}

/// `lr=0.012 (was 0.05), bs=64 (was 32)`: the keys an exploit changed,
/// nested ones dotted.
pub(crate) fn config_change(old: &serde_json::Value, new: &serde_json::Value) -> String {
    fn walk(prefix: &str, old: &serde_json::Value, new: &serde_json::Value, out: &mut Vec<String>) {
        match (old, new) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&path, a.get(k).unwrap_or(&serde_json::Value::Null), v, out);
                }
            }
            (a, b) if a != b => out.push(format!("{prefix}={b} (was {a})")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", old, new, &mut out);
    if out.is_empty() {
        "config unchanged".into()
    } else {
        out.join(", ")
    }
}

/// `checkpoint_000007` for `.../checkpoint_000007` (a path or a URL).
pub(crate) fn checkpoint_name(uri: &str) -> &str {
    uri.trim_end_matches('/').rsplit('/').next().unwrap_or(uri)
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_in_urls_are_never_shown() {
        assert_eq!(super::redact_url("https://me:pa55@h:5000/p"), "https://me:***@h:5000/p");
        assert_eq!(super::redact_url("https://h/p@x"), "https://h/p@x");
        assert_eq!(super::redact_url("plain"), "plain");
    }

    use super::*;

    #[test]
    fn a_headline_is_one_line_with_the_log_named() {
        let msg = "rank 1 exited with code 3; last log lines (/x/logs/rank-1.log):\nTraceback\nValueError: boom";
        assert_eq!(headline(msg), "rank 1 exited with code 3; log: /x/logs/rank-1.log");
        assert_eq!(headline("trial reported no `loss`"), "trial reported no `loss`");
        assert_eq!(headline(""), "");
    }

    #[test]
    fn numbers_and_configs_are_compact() {
        assert_eq!(fmt_num(0.123456), "0.1235");
        assert_eq!(fmt_num(3.0), "3");
        assert_eq!(fmt_num(0.00001234), "1.234e-5");
        let c = serde_json::json!({"lr": 0.001, "model": {"width": 64}, "opt": "adam"});
        assert_eq!(config_summary(&c), "lr=0.001 model.width=64 opt=\"adam\"");
    }
}
