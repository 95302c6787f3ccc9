//! The largest size that fits: `--fit-in`'s max batch, max sequence and max context, and
//! `memfit max-batch`'s answer.
//!
//! The predicate is monotone (memory grows with the batch, the sequence, the context), so an
//! answer `n` is proved by two evaluations: `cost(n) ≤ budget` and `cost(n + 1) > budget` (or
//! `n` the bound). [`largest_within`] guesses `n` from the cost's form — affine in the batch,
//! a polynomial of degree ≤ 2 in the sequence (the attention scores), up to the peak moving
//! from one op to another — fitted through the sizes 1, 2, 4 and the guesses so far, and
//! proves it; a guess that fails the proof narrows the bracket, and after [`GUESSES`] guesses
//! the search bisects inside it. Whatever the guesses, the answer is what a scan of every size
//! would give (tested on affine, quadratic, piecewise and step costs); a typical answer costs
//! 5 evaluations, where doubling and bisection cost about `2·log₂ n`.

use std::cell::RefCell;

/// Guesses from the fitted form before bisecting.
pub const GUESSES: usize = 3;

/// The largest passing size in `lo..up`, `lo` passing and `up` failing: doubling from `lo`,
/// then bisection below the first failure.
fn between(mut lo: u64, mut up: u64, ok: impl Fn(u64) -> bool) -> u64 {
    let mut probe = lo.saturating_mul(2);
    while probe < up {
        if ok(probe) {
            lo = probe;
            probe = probe.saturating_mul(2);
        } else {
            up = probe;
        }
    }
    while up - lo > 1 {
        let mid = lo + (up - lo) / 2;
        if ok(mid) {
            lo = mid;
        } else {
            up = mid;
        }
    }
    lo
}

/// The largest `n` in `0..=hi` with `cost(n) ≤ budget`, `cost` non-decreasing (0 when even
/// `cost(1)` exceeds the budget). See the module docs; each size is evaluated at most once.
pub fn largest_within(hi: u64, budget: u64, cost: impl Fn(u64) -> u64) -> u64 {
    let seen: RefCell<Vec<(u64, u64)>> = RefCell::new(Vec::new());
    let f = |x: u64| -> u64 {
        if let Some(&(_, y)) = seen.borrow().iter().find(|(sx, _)| *sx == x) {
            return y;
        }
        let y = cost(x);
        seen.borrow_mut().push((x, y));
        y
    };
    let ok = |x: u64| f(x) <= budget;
    if hi == 0 || !ok(1) {
        return 0;
    }
    // `lo` passes; `up` fails (`hi + 1`: no size is known to fail).
    let (mut lo, mut up) = (1u64, hi.saturating_add(1));
    for &x in &[2u64, 4] {
        if x < up && x <= hi {
            if ok(x) {
                lo = lo.max(x);
            } else {
                up = up.min(x);
            }
        }
    }
    for _ in 0..GUESSES {
        if up - lo <= 1 {
            return lo;
        }
        let Some(g) = guess(&seen.borrow(), budget) else {
            break;
        };
        // Inside the bracket, so that each guess narrows it.
        let g = g.clamp(lo + 1, up - 1);
        if ok(g) {
            if g == hi {
                return g;
            }
            if !ok(g + 1) {
                return g;
            }
            lo = g + 1;
        } else {
            up = g;
        }
    }
    if up - lo <= 1 {
        return lo;
    }
    if up > hi {
        if ok(hi) {
            return hi;
        }
        up = hi;
    }
    between(lo, up, ok)
}

/// The largest `x` at which the quadratic through the three evaluated sizes nearest the
/// budget's crossing stays within it (a line when the points are collinear or only two).
fn guess(points: &[(u64, u64)], budget: u64) -> Option<u64> {
    let mut p: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x as f64, y as f64)).collect();
    let b = budget as f64;
    // Nearest the budget first.
    p.sort_by(|a, c| (a.1 - b).abs().total_cmp(&(c.1 - b).abs()));
    p.truncate(3);
    p.sort_by(|a, c| a.0.total_cmp(&c.0));
    if p.len() < 2 {
        return None;
    }
    let root = if p.len() == 3 {
        let [(x0, y0), (x1, y1), (x2, y2)] = [p[0], p[1], p[2]];
        // Newton's divided differences: y = y0 + d1·(x − x0) + d2·(x − x0)(x − x1).
        let d1 = (y1 - y0) / (x1 - x0);
        let d2 = ((y2 - y1) / (x2 - x1) - d1) / (x2 - x0);
        // a x² + bb x + c = budget.
        let a = d2;
        let bb = d1 - d2 * (x0 + x1);
        let c = y0 - d1 * x0 + d2 * x0 * x1 - b;
        if a.abs() < 1e-12 * (bb.abs() + 1.0) {
            (bb > 0.0).then(|| -c / bb)?
        } else {
            let disc = bb * bb - 4.0 * a * c;
            if disc < 0.0 {
                return None;
            }
            // The larger root of an upward parabola; the root on the rising side otherwise.
            let r = (-bb + disc.sqrt()) / (2.0 * a);
            let r2 = (-bb - disc.sqrt()) / (2.0 * a);
            if a > 0.0 { r.max(r2) } else { r.min(r2) }
        }
    } else {
        let [(x0, y0), (x1, y1)] = [p[0], p[1]];
        let slope = (y1 - y0) / (x1 - x0);
        (slope > 0.0).then(|| x0 + (b - y0) / slope)?
    };
    (root.is_finite() && root >= 1.0).then(|| root.floor().min(u64::MAX as f64 / 2.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(hi: u64, budget: u64, cost: &dyn Fn(u64) -> u64) -> u64 {
        (1..=hi)
            .take_while(|&x| cost(x) <= budget)
            .last()
            .unwrap_or(0)
    }

    /// Affine, quadratic, piecewise (a peak moving from one op to another), concave, step and
    /// flat costs, every budget between their ends: the scan's answer, each size asked once; an
    /// affine or quadratic cost answered in at most 6 evaluations.
    #[test]
    fn largest_within_equals_a_scan() {
        type Cost = Box<dyn Fn(u64) -> u64>;
        let costs: Vec<(&str, Cost, bool)> = vec![
            ("affine", Box::new(|x| 1_000 + 37 * x), true),
            ("quadratic", Box::new(|x| 5_000 + 300 * x + 3 * x * x), true),
            ("steep quadratic", Box::new(|x| 10 + x * x * 11), true),
            (
                "max of lines",
                Box::new(|x| (90_000 + 10 * x).max(200 * x).max(60 * x + 40_000)),
                false,
            ),
            ("steps", Box::new(|x| 1_000 * (x / 7) + 5), false),
            (
                "concave",
                Box::new(|x| ((x as f64).sqrt() * 1_000.0) as u64),
                false,
            ),
            (
                "min of lines",
                Box::new(|x| (500 * x).min(40_000 + 20 * x)),
                false,
            ),
            ("flat", Box::new(|_| 77), false),
            (
                "rounded",
                Box::new(|x| (3 * x * x + 5 * x).next_multiple_of(512)),
                false,
            ),
        ];
        for (name, cost, smooth) in &costs {
            for hi in [1u64, 5, 300, 100_000] {
                let top = cost(hi);
                let mut budgets: Vec<u64> = (0..=40).map(|i| top / 40 * i).collect();
                budgets.extend([0, cost(1) - 1, cost(1), top - 1, top, top + 1]);
                for budget in budgets {
                    let want = scan(hi.min(5_000), budget, cost.as_ref());
                    if hi > 5_000 && want == 5_000 {
                        continue;
                    }
                    let asked = RefCell::new(Vec::new());
                    let got = largest_within(hi, budget, |x| {
                        asked.borrow_mut().push(x);
                        cost(x)
                    });
                    assert_eq!(got, want, "{name}: hi {hi}, budget {budget}");
                    let mut a = asked.borrow().clone();
                    let n = a.len();
                    a.sort();
                    a.dedup();
                    assert_eq!(a.len(), n, "{name}: a size asked twice");
                    if *smooth {
                        assert!(n <= 6, "{name}: hi {hi}, budget {budget}: {n} evaluations");
                    }
                }
            }
        }
    }
}
