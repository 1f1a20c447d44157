//! Learning-curve extrapolation: a weighted ensemble of parametric curve
//! families fitted to a trial's points so far, predicting its value at the
//! end of training with an uncertainty. Pure arithmetic, no randomness:
//! the same points always give the same prediction.
//!
//! The curve is a loss `l` (smaller is better) over the training fraction
//! `u = t / max_t` in (0, 1]. Each family is `l = c + a * g(u)` with one
//! shape parameter, `a >= 0` (training does not make a model worse), fitted
//! by weighted least squares for each shape on a fixed grid:
//!
//! - power law `g = u^-alpha` (Domhan et al.'s pow3; most learning curves
//!   in training-set size are power laws),
//! - exponential decay `g = exp(-beta u)` (exp3: epochs converging),
//! - log-linear `g = -ln u` (no floor within reach),
//! - flat `l = c` (the curve has levelled off).
//!
//! Later points weigh more (`sqrt(u_i / u_last)`): they are nearer the end
//! and the early transient says least about it. The families' predictions
//! at `u = 1` are mixed with BIC weights; the spread is the weighted
//! residual noise together with the disagreement between families.

/// Shapes tried for the power law.
const ALPHAS: [f64; 10] = [0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.4, 2.0];
/// Shapes tried for the exponential decay (in units of the whole run).
const BETAS: [f64; 9] = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// A prediction of the loss at `u = 1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// The ensemble's mean.
    pub mean: f64,
    /// Its standard deviation (noise and model disagreement), never 0.
    pub sd: f64,
}

/// One family's best fit: its prediction at `u = 1`, its weighted residual
/// variance and its number of parameters.
#[derive(Debug, Clone, Copy)]
struct Fit {
    at_end: f64,
    variance: f64,
    params: f64,
}

/// Weighted least squares of `l = c + a g` over the points, `a >= 0`;
/// returns (c, a, weighted squared error).
fn linear(points: &[(f64, f64, f64)], g: impl Fn(f64) -> f64) -> Option<(f64, f64, f64)> {
    let (mut sw, mut sg, mut sl, mut sgg, mut sgl) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(u, l, w) in points {
        let x = g(u);
        sw += w;
        sg += w * x;
        sl += w * l;
        sgg += w * x * x;
        sgl += w * x * l;
    }
    let det = sw * sgg - sg * sg;
    let (c, a) = if det.abs() > 1e-12 * sw * sgg.max(1e-300) {
        let a = (sw * sgl - sg * sl) / det;
        if a >= 0.0 {
            ((sl - a * sg) / sw, a)
        } else {
            (sl / sw, 0.0)
        }
    } else {
        (sl / sw, 0.0)
    };
    let sse: f64 = points.iter().map(|&(u, l, w)| w * (l - c - a * g(u)).powi(2)).sum();
    (c.is_finite() && a.is_finite()).then_some((c, a, sse))
}

/// The best shape of one family: the grid value with the least error,
/// refined by a golden-section search between its neighbours.
fn family(points: &[(f64, f64, f64)], shapes: &[f64], g: impl Fn(f64, f64) -> f64) -> Option<(f64, f64)> {
    let fit = |s: f64| linear(points, |u| g(u, s)).map(|(c, a, sse)| (c + a * g(1.0, s), sse));
    let err = |s: f64| fit(s).map_or(f64::INFINITY, |f| f.1);
    let (i, _) = shapes.iter().enumerate().map(|(i, &s)| (i, err(s))).min_by(|a, b| a.1.total_cmp(&b.1))?;
    let (mut lo, mut hi) = (shapes[i.saturating_sub(1)], shapes[(i + 1).min(shapes.len() - 1)]);
    let ratio = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..20 {
        let (x1, x2) = (hi - ratio * (hi - lo), lo + ratio * (hi - lo));
        if err(x1) <= err(x2) {
            hi = x2;
        } else {
            lo = x1;
        }
    }
    let best = [shapes[i], (lo + hi) / 2.0].into_iter().min_by(|a, b| err(*a).total_cmp(&err(*b)))?;
    fit(best)
}

/// Predicts the loss at `u = 1` from `(u, loss)` points with `u` in (0, 1],
/// ascending. `None` without a finite point.
pub fn predict(points: &[(f64, f64)]) -> Option<Prediction> {
    let pts: Vec<(f64, f64)> = points.iter().copied().filter(|(u, l)| u.is_finite() && *u > 0.0 && l.is_finite()).collect();
    let &(u_last, l_last) = pts.last()?;
    let weighted: Vec<(f64, f64, f64)> = pts.iter().map(|&(u, l)| (u.min(1.0), l, (u / u_last).sqrt())).collect();
    let sw: f64 = weighted.iter().map(|p| p.2).sum();
    let n = pts.len() as f64;
    let mut fits = Vec::with_capacity(4);
    // Flat: the weighted mean of the last third of the points.
    let tail = &weighted[weighted.len() - weighted.len().div_ceil(3)..];
    let tw: f64 = tail.iter().map(|p| p.2).sum();
    let flat = tail.iter().map(|p| p.1 * p.2).sum::<f64>() / tw;
    let flat_sse: f64 = weighted.iter().map(|&(_, l, w)| w * (l - flat).powi(2)).sum();
    fits.push(Fit { at_end: flat, variance: flat_sse / sw, params: 1.0 });
    if pts.len() >= 3 {
        let curved = [
            family(&weighted, &ALPHAS, |u, a| u.powf(-a)),
            family(&weighted, &BETAS, |u, b| (-b * u).exp()),
            linear(&weighted, |u| -u.ln()).map(|(c, _, sse)| (c, sse)),
        ];
        for (at_end, sse) in curved.into_iter().flatten() {
            fits.push(Fit { at_end, variance: sse / sw, params: 3.0 });
        }
    }
    // BIC weights over the families (a floor on the variance keeps a
    // perfect fit from taking all the weight on nothing).
    let scale = l_last.abs().max(1e-12);
    let floor = (1e-6 * scale).powi(2);
    let bic: Vec<f64> = fits.iter().map(|f| n * (f.variance + floor).ln() + f.params * n.ln()).collect();
    let best = bic.iter().copied().fold(f64::INFINITY, f64::min);
    let weights: Vec<f64> = bic.iter().map(|b| (-0.5 * (b - best)).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mean = fits.iter().zip(&weights).map(|(f, w)| w * f.at_end).sum::<f64>() / total;
    let spread = fits.iter().zip(&weights).map(|(f, w)| w * (f.at_end - mean).powi(2)).sum::<f64>() / total;
    let noise = fits.iter().zip(&weights).map(|(f, w)| w * f.variance).sum::<f64>() / total;
    let sd = (spread + noise).sqrt().max(1e-6 * scale);
    Some(Prediction { mean, sd })
}

/// The standard normal's distribution function.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * (1.0 + statrs::function::erf::erf(x / std::f64::consts::SQRT_2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(f: impl Fn(f64) -> f64, us: &[f64]) -> Vec<(f64, f64)> {
        us.iter().map(|&u| (u, f(u))).collect()
    }

    fn geometric(first: f64, last: f64, n: usize) -> Vec<f64> {
        (0..n).map(|i| first * (last / first).powf(i as f64 / (n - 1) as f64)).collect()
    }

    #[test]
    fn a_power_law_is_extrapolated_to_its_end() {
        // l = 0.1 + 0.05 u^-0.5: at u = 1, 0.15. Seen up to u = 1/8.
        let us = geometric(1.0 / 256.0, 1.0 / 8.0, 12);
        let p = predict(&curve(|u| 0.1 + 0.05 * u.powf(-0.5), &us)).unwrap();
        assert!((p.mean - 0.15).abs() < 0.01, "{p:?}");
        // The value at u = 1/8 is 0.241: the prediction is well below it.
        assert!(p.mean < 0.2, "{p:?}");
    }

    #[test]
    fn an_exponential_decay_is_extrapolated_to_its_floor() {
        let us: Vec<f64> = (1..=30).map(|i| i as f64 / 100.0).collect();
        let p = predict(&curve(|u| 0.3 + 0.7 * (-12.0 * u).exp(), &us)).unwrap();
        assert!((p.mean - 0.3).abs() < 0.01, "{p:?}");
    }

    #[test]
    fn a_flat_curve_predicts_its_level_and_noise_widens_the_spread() {
        let us = geometric(0.01, 0.5, 10);
        let flat = predict(&curve(|_| 0.2, &us)).unwrap();
        assert!((flat.mean - 0.2).abs() < 1e-9 && flat.sd < 1e-3, "{flat:?}");
        let noisy: Vec<(f64, f64)> = us.iter().enumerate().map(|(i, &u)| (u, 0.2 + if i % 2 == 0 { 0.02 } else { -0.02 })).collect();
        let p = predict(&noisy).unwrap();
        assert!(p.sd > 0.01, "{p:?}");
    }

    #[test]
    fn predictions_are_deterministic_and_ignore_non_finite_points() {
        let us = geometric(0.01, 0.3, 8);
        let mut pts = curve(|u| 0.5 * u.powf(-0.3), &us);
        let a = predict(&pts).unwrap();
        assert_eq!(a, predict(&pts).unwrap());
        pts.insert(3, (0.05, f64::NAN));
        assert_eq!(a, predict(&pts).unwrap());
        assert!(predict(&[]).is_none());
        assert!(predict(&[(0.1, f64::INFINITY)]).is_none());
    }

    #[test]
    fn the_normal_cdf_is_right() {
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_cdf(1.96) - 0.975).abs() < 1e-4);
        assert!((normal_cdf(-1.645) - 0.05).abs() < 1e-4);
    }
}
