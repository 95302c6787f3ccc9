//! `memfit run --shard I/N`: one of N deterministic slices of a workload's cases, balanced by
//! predicted cost, so that N machines (a Slurm job array) share a sweep.
//!
//! Each case's cost is its predicted work ([`super::estimate::work`]: FLOPs of the asked phases
//! and the warm-up, plus a per-parameter term). Cases are dealt longest first (ties by case
//! index) to the shard with the least total so far (ties: the lower shard) — the LPT rule,
//! within 4/3 of the best possible largest shard. Data-loading cases, whose cost is not in
//! FLOPs, are dealt the same way among themselves with equal costs. The same workload, flags
//! and memfit version give the same slices on every machine. `--shard auto` takes I and N from
//! Slurm's `SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN` and `SLURM_ARRAY_TASK_COUNT`.

use crate::error::UserError;

/// Shard `index` (0-based) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Most shards accepted.
pub const MAX_SHARDS: usize = 100_000;

/// `I/N` (0 ≤ I < N) or `auto` (from the Slurm array task's environment).
pub fn parse(text: &str) -> Result<Shard, UserError> {
    let bad = |value: &str, reason: &str| UserError::OutOfRange {
        origin: "flags".into(),
        key: "shard".into(),
        value: value.into(),
        reason: reason.into(),
        allowed: format!("I/N with 0 ≤ I < N ≤ {MAX_SHARDS}, or auto inside a Slurm job array"),
    };
    if text == "auto" {
        let var = |k: &str| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
        };
        let (Some(id), Some(count)) = (var("SLURM_ARRAY_TASK_ID"), var("SLURM_ARRAY_TASK_COUNT"))
        else {
            return Err(bad(
                "auto",
                "SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT are not set (not a Slurm array task)",
            ));
        };
        let min = var("SLURM_ARRAY_TASK_MIN").unwrap_or(0);
        let index = id
            .checked_sub(min)
            .ok_or_else(|| bad("auto", "SLURM_ARRAY_TASK_ID is below SLURM_ARRAY_TASK_MIN"))?;
        return check(Shard { index, count }, &bad, text);
    }
    let (i, n) = text
        .split_once('/')
        .ok_or_else(|| bad(text, "not of the form I/N"))?;
    let (Ok(index), Ok(count)) = (i.trim().parse::<usize>(), n.trim().parse::<usize>()) else {
        return Err(bad(text, "I and N must be whole numbers"));
    };
    check(Shard { index, count }, &bad, text)
}

fn check(s: Shard, bad: &dyn Fn(&str, &str) -> UserError, text: &str) -> Result<Shard, UserError> {
    if s.count == 0 || s.count > MAX_SHARDS {
        Err(bad(text, "N is out of range"))
    } else if s.index >= s.count {
        Err(bad(text, "I must be below N (shards are numbered from 0)"))
    } else {
        Ok(s)
    }
}

/// The shard of each case, for `count` shards: `costs[i]` is case i's predicted work, `None`
/// for a data-loading case.
pub fn assign(costs: &[Option<f64>], count: usize) -> Vec<usize> {
    let mut shard = vec![0; costs.len()];
    for model_cases in [true, false] {
        let mut order: Vec<(usize, f64)> = costs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_some() == model_cases)
            .map(|(i, c)| (i, c.unwrap_or(1.0)))
            .collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut load = vec![0.0f64; count];
        for (i, c) in order {
            let (best, _) = load
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(&b.0)))
                .expect("at least one shard");
            shard[i] = best;
            load[best] += c;
        }
    }
    shard
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses_with_the_key() {
        assert_eq!(parse("2/4").unwrap(), Shard { index: 2, count: 4 });
        for bad in ["4/4", "1/0", "x/2", "3", "-1/2"] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("`shard`"), "{e}");
        }
    }

    #[test]
    fn longest_first_to_the_lightest_shard() {
        // 7, 5, 4, 3, 1 over 2 shards: 7 → 0, 5 → 1, 4 → 1, 3 → 0, 1 → 1 (10 / 10).
        let costs = [Some(3.0), Some(7.0), Some(1.0), Some(5.0), Some(4.0)];
        assert_eq!(assign(&costs, 2), vec![0, 0, 1, 1, 1]);
        // Every case in exactly one shard, the same answer every time.
        assert_eq!(assign(&costs, 2), assign(&costs, 2));
        // More shards than cases: the extra ones are empty.
        assert_eq!(assign(&costs[..2], 4), vec![1, 0]);
        // Data-loading cases are dealt among themselves.
        let mixed = [Some(9.0), None, None, Some(1.0)];
        assert_eq!(assign(&mixed, 2), vec![0, 0, 1, 1]);
    }
}
