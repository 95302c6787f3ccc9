//! A straight line through points: what a claim fits through one sweep it selected (F1's
//! proportionality, F4's batch sweep, B3's working copy at B 0). The least squares are
//! [`super::least_squares`]'s; the claims (`report::claims`) only choose the points.

/// A straight line `y = fixed + slope·x` fitted by least squares, with its R².
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Affine {
    pub fixed: f64,
    pub slope: f64,
    pub r2: f64,
}

impl Affine {
    /// The line through `points` (x, y); `None` with fewer than two distinct x.
    pub fn fit(points: &[(f64, f64)]) -> Option<Affine> {
        let x: Vec<Vec<f64>> = points.iter().map(|(x, _)| vec![1.0, *x]).collect();
        let y: Vec<f64> = points.iter().map(|(_, y)| *y).collect();
        let f = super::least_squares(&x, &y)?;
        f.used[1].then_some(Affine {
            fixed: f.coef[0],
            slope: f.coef[1],
            r2: f.r2,
        })
    }

    pub fn at(&self, x: f64) -> f64 {
        self.fixed + self.slope * x
    }
}
