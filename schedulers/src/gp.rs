//! A small Gaussian process for PB2's explore step: exact GP regression
//! with the time-varying squared-exponential kernel of Parker-Holder et al.
//! (2020),
//!
//! ```text
//! k(x, x') = variance * exp(-|h - h'|^2 / (2 lengthscale^2)) * (1 - epsilon)^(|t - t'| / 2)
//! ```
//!
//! where a point `x = (t, h)` is a time `t` (the first coordinate) and
//! features `h` in the unit cube. Observations further apart in time are
//! less correlated, so the model follows a reward surface that drifts as
//! training goes on. The kernel's hyperparameters are fitted by maximising
//! the log marginal likelihood over a grid (the signal variance in closed
//! form for each grid point), which is robust on the few dozen points PB2
//! sees and needs no gradient.

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};

/// The time-varying squared-exponential kernel's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TvKernel {
    /// Signal variance.
    pub variance: f64,
    /// Lengthscale of the features (they lie in the unit cube).
    pub lengthscale: f64,
    /// Forgetting rate in [0, 1): correlation decays by `(1 - epsilon)^(|dt| / 2)`.
    pub epsilon: f64,
}

impl TvKernel {
    /// `k(a, b)`; the first coordinate of each point is its time.
    pub fn k(&self, a: &[f64], b: &[f64]) -> f64 {
        let dt = (a[0] - b[0]).abs();
        let d2: f64 = a[1..].iter().zip(&b[1..]).map(|(x, y)| (x - y) * (x - y)).sum();
        self.variance * (-d2 / (2.0 * self.lengthscale * self.lengthscale)).exp() * (1.0 - self.epsilon).powf(dt / 2.0)
    }
}

const LENGTHSCALES: [f64; 8] = [0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5];
const EPSILONS: [f64; 7] = [0.0, 0.01, 0.03, 0.1, 0.2, 0.35, 0.5];
/// Noise variance as a fraction of the signal variance.
const NOISE_RATIOS: [f64; 6] = [1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0];

/// A Gaussian process fitted to observations (standardized internally).
#[derive(Debug, Clone)]
pub struct Gp {
    x: Vec<Vec<f64>>,
    kernel: TvKernel,
    noise: f64,
    chol: Cholesky<f64, Dyn>,
    alpha: DVector<f64>,
    y_mean: f64,
    y_sd: f64,
    lml: f64,
}

impl Gp {
    /// Fits a GP to `(x, y)`, choosing the kernel's hyperparameters and the
    /// noise by log marginal likelihood. `None` without observations or
    /// when the points have no common dimension.
    pub fn fit(x: Vec<Vec<f64>>, y: &[f64]) -> Option<Gp> {
        let dim = x.first()?.len();
        if dim == 0 || x.len() != y.len() || x.iter().any(|p| p.len() != dim || p.iter().any(|v| !v.is_finite())) {
            return None;
        }
        let (y_mean, y_sd) = standardization(y)?;
        let ys = DVector::from_iterator(y.len(), y.iter().map(|v| (v - y_mean) / y_sd));
        let n = y.len() as f64;
        let mut best: Option<(f64, TvKernel, f64)> = None;
        for &lengthscale in &LENGTHSCALES {
            for &epsilon in &EPSILONS {
                let unit = TvKernel { variance: 1.0, lengthscale, epsilon };
                let base = gram(&unit, &x);
                for &ratio in &NOISE_RATIOS {
                    let Some(chol) = Cholesky::new(&base + DMatrix::identity(x.len(), x.len()) * ratio) else { continue };
                    // With C = K/variance + ratio I, the likelihood is highest at variance = y' C^-1 y / n.
                    let quad = ys.dot(&chol.solve(&ys));
                    let variance = (quad / n).max(1e-12);
                    let log_det: f64 = chol.l_dirty().diagonal().iter().map(|d| d.ln()).sum::<f64>() * 2.0;
                    let lml = -0.5 * n * variance.ln() - 0.5 * log_det - 0.5 * n * (1.0 + (2.0 * std::f64::consts::PI).ln());
                    if best.as_ref().is_none_or(|b| lml > b.0) {
                        best = Some((lml, TvKernel { variance, lengthscale, epsilon }, ratio * variance));
                    }
                }
            }
        }
        let (_, kernel, noise) = best?;
        Gp::with_kernel(x, y, kernel, noise)
    }

    /// A GP with the given kernel and noise variance (in standardized units).
    pub fn with_kernel(x: Vec<Vec<f64>>, y: &[f64], kernel: TvKernel, noise: f64) -> Option<Gp> {
        let (y_mean, y_sd) = standardization(y)?;
        let ys = DVector::from_iterator(y.len(), y.iter().map(|v| (v - y_mean) / y_sd));
        let chol = Cholesky::new(gram(&kernel, &x) + DMatrix::identity(x.len(), x.len()) * noise)?;
        let alpha = chol.solve(&ys);
        let n = y.len() as f64;
        let log_det: f64 = chol.l_dirty().diagonal().iter().map(|d| d.ln()).sum::<f64>() * 2.0;
        let lml = -0.5 * ys.dot(&alpha) - 0.5 * log_det - 0.5 * n * (2.0 * std::f64::consts::PI).ln();
        Some(Gp { x, kernel, noise, chol, alpha, y_mean, y_sd, lml })
    }

    /// The fitted kernel.
    pub fn kernel(&self) -> TvKernel {
        self.kernel
    }

    /// The log marginal likelihood of the (standardized) observations.
    pub fn log_marginal_likelihood(&self) -> f64 {
        self.lml
    }

    /// The posterior mean and variance of the latent function at `p`, in
    /// the observations' units.
    pub fn predict(&self, p: &[f64]) -> (f64, f64) {
        let ks = DVector::from_iterator(self.x.len(), self.x.iter().map(|q| self.kernel.k(q, p)));
        let mean = ks.dot(&self.alpha);
        let var = posterior_variance(&self.kernel, &self.chol, &ks, p);
        (self.y_mean + self.y_sd * mean, var * self.y_sd * self.y_sd)
    }

    /// The same model with `extra` points added as if observed (their
    /// values do not matter: only the variance is read from it). PB2 adds
    /// the configs other trials are already running, so its UCB does not
    /// send the next trial where they already are.
    pub fn with_pending(&self, extra: &[Vec<f64>]) -> Option<Pending> {
        let mut x = self.x.clone();
        x.extend(extra.iter().cloned());
        let chol = Cholesky::new(gram(&self.kernel, &x) + DMatrix::identity(x.len(), x.len()) * self.noise)?;
        Some(Pending { x, kernel: self.kernel, chol, y_sd: self.y_sd })
    }
}

/// A GP's covariance with pending points added: its posterior variance.
#[derive(Debug, Clone)]
pub struct Pending {
    x: Vec<Vec<f64>>,
    kernel: TvKernel,
    chol: Cholesky<f64, Dyn>,
    y_sd: f64,
}

impl Pending {
    /// The posterior variance at `p`, in the observations' units.
    pub fn variance(&self, p: &[f64]) -> f64 {
        let ks = DVector::from_iterator(self.x.len(), self.x.iter().map(|q| self.kernel.k(q, p)));
        posterior_variance(&self.kernel, &self.chol, &ks, p) * self.y_sd * self.y_sd
    }
}

fn posterior_variance(kernel: &TvKernel, chol: &Cholesky<f64, Dyn>, ks: &DVector<f64>, p: &[f64]) -> f64 {
    let mut v = ks.clone();
    chol.l_dirty().solve_lower_triangular_mut(&mut v);
    (kernel.k(p, p) - v.norm_squared()).max(0.0)
}

fn gram(kernel: &TvKernel, x: &[Vec<f64>]) -> DMatrix<f64> {
    let n = x.len();
    let mut m = DMatrix::zeros(n, n);
    for i in 0..n {
        for j in 0..=i {
            let k = kernel.k(&x[i], &x[j]);
            m[(i, j)] = k;
            m[(j, i)] = k;
        }
    }
    m
}

/// Mean and standard deviation to standardize `y` by (1 when constant).
fn standardization(y: &[f64]) -> Option<(f64, f64)> {
    if y.is_empty() || y.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let n = y.len() as f64;
    let mean = y.iter().sum::<f64>() / n;
    let sd = (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    Some((mean, if sd > 1e-12 { sd } else { 1.0 }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(x: f64) -> f64 {
        (6.0 * x).sin() + 0.5 * x
    }

    /// On a smooth known function sampled at 15 points, the fitted GP
    /// interpolates held-out points closely, is sure near the data and
    /// unsure far from it, and forgets nothing (epsilon 0) when nothing drifts.
    #[test]
    fn it_recovers_a_known_function() {
        let xs: Vec<f64> = (0..15).map(|i| i as f64 / 14.0 * 0.8).collect();
        let gp = Gp::fit(xs.iter().map(|&x| vec![0.0, x]).collect(), &xs.iter().map(|&x| f(x)).collect::<Vec<_>>()).unwrap();
        for i in 0..20 {
            let x = 0.02 + i as f64 * 0.035;
            let (mean, var) = gp.predict(&[0.0, x]);
            assert!((mean - f(x)).abs() < 0.03, "at {x}: {mean} vs {}", f(x));
            assert!(var < 0.01, "at {x}: variance {var}");
        }
        // Beyond the data (0.8 .. 1) and at a distance in features, the uncertainty grows.
        let (_, near) = gp.predict(&[0.0, 0.4]);
        let (_, far) = gp.predict(&[0.0, 1.6]);
        assert!(far > 100.0 * near.max(1e-9), "near {near}, far {far}");
        assert_eq!(gp.kernel().epsilon, 0.0, "{:?}", gp.kernel());
    }

    /// When the function changes sign over time, the fitted kernel forgets
    /// (epsilon > 0) and the prediction at the latest time follows the
    /// latest observations.
    #[test]
    fn the_time_kernel_follows_a_drifting_function() {
        let mut x = Vec::new();
        let mut y = Vec::new();
        for t in 0..8 {
            let sign = if t < 4 { 1.0 } else { -1.0 };
            for i in 0..6 {
                let h = i as f64 / 5.0;
                x.push(vec![t as f64 * 2.0, h]);
                y.push(sign * f(h));
            }
        }
        let gp = Gp::fit(x, &y).unwrap();
        assert!(gp.kernel().epsilon > 0.0, "{:?}", gp.kernel());
        for h in [0.1, 0.35, 0.7] {
            let (mean, _) = gp.predict(&[14.0, h]);
            assert!((mean + f(h)).abs() < 0.15, "at {h}: {mean} vs {}", -f(h));
        }
    }

    /// Adding a pending point shrinks the variance there, and barely where
    /// the data already are.
    #[test]
    fn pending_points_lower_the_variance_where_they_are() {
        let xs = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5];
        let gp = Gp::fit(xs.iter().map(|&x| vec![0.0, x]).collect(), &xs.map(f)).unwrap();
        let pending = gp.with_pending(&[vec![0.0, 0.9]]).unwrap();
        let (_, before) = gp.predict(&[0.0, 0.9]);
        assert!(pending.variance(&[0.0, 0.9]) < 0.2 * before, "{} vs {before}", pending.variance(&[0.0, 0.9]));
        let (_, at_data) = gp.predict(&[0.0, 0.2]);
        let after = pending.variance(&[0.0, 0.2]);
        assert!(after <= at_data && after > 0.8 * at_data, "{after} vs {at_data}");
    }

    /// The grid's choice has a higher likelihood than its neighbours.
    #[test]
    fn the_fit_maximises_the_marginal_likelihood() {
        let xs: Vec<f64> = (0..10).map(|i| i as f64 / 9.0).collect();
        let x: Vec<Vec<f64>> = xs.iter().map(|&x| vec![0.0, x]).collect();
        let y: Vec<f64> = xs.iter().map(|&v| f(v)).collect();
        let gp = Gp::fit(x.clone(), &y).unwrap();
        let k = gp.kernel();
        for other in [
            TvKernel { lengthscale: k.lengthscale * 3.0, ..k },
            TvKernel { lengthscale: k.lengthscale / 3.0, ..k },
            TvKernel { variance: k.variance * 4.0, ..k },
        ] {
            let alt = Gp::with_kernel(x.clone(), &y, other, gp.noise).unwrap();
            assert!(alt.log_marginal_likelihood() < gp.log_marginal_likelihood(), "{other:?}");
        }
        let noisier = Gp::with_kernel(x, &y, k, gp.noise * 10.0 + 1e-3).unwrap();
        assert!(noisier.log_marginal_likelihood() < gp.log_marginal_likelihood());
    }
}
