//! A fault switch for the tests of the sweep's isolation: `MEMFIT_FAULT=KIND@PHASE[:CASE],…`
//! makes the case's process fail on purpose when it first announces `PHASE` (for the first
//! asked phase that is before the warm-up step), for every case or only case `CASE`.
//!
//! KIND: `panic`, `abort` (SIGABRT), `kill` (SIGKILL to itself, as a kill from outside),
//! `exit=CODE`, `sleep=SECONDS` (then it carries on: for timeouts and interrupts), `alloc`
//! (asks for 1 TiB: with `--mem-budget`, the budget's own out-of-memory abort).
//!
//! Nothing sets it but a test; a malformed value is an error naming the variable.

use crate::phase::Phase;

/// The environment variable.
pub const ENV: &str = "MEMFIT_FAULT";

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Panic,
    Abort,
    Kill,
    Exit(i32),
    Sleep(f64),
    Alloc,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub kind: Kind,
    pub phase: Phase,
    pub case: Option<usize>,
}

/// The faults in `MEMFIT_FAULT` (none when it is unset or empty).
pub fn from_env() -> anyhow::Result<Vec<Fault>> {
    match std::env::var(ENV) {
        Ok(v) => parse(&v),
        Err(_) => Ok(Vec::new()),
    }
}

pub fn parse(text: &str) -> anyhow::Result<Vec<Fault>> {
    let bad = |item: &str, why: &str| {
        anyhow::anyhow!(
            "{ENV}: `{item}`: {why}; allowed: KIND@PHASE[:CASE] with KIND panic, abort, kill, \
             exit=CODE, sleep=SECONDS, alloc and PHASE one of {}",
            Phase::names()
        )
    };
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (kind, rest) = item.split_once('@').ok_or_else(|| bad(item, "no `@`"))?;
        let (phase, case) = match rest.split_once(':') {
            Some((p, c)) => (
                p,
                Some(
                    c.parse::<usize>()
                        .map_err(|_| bad(item, "CASE is not a number"))?,
                ),
            ),
            None => (rest, None),
        };
        let phase = Phase::parse(phase).ok_or_else(|| bad(item, "unknown phase"))?;
        let kind = match kind.split_once('=') {
            None if kind == "panic" => Kind::Panic,
            None if kind == "abort" => Kind::Abort,
            None if kind == "kill" => Kind::Kill,
            None if kind == "alloc" => Kind::Alloc,
            Some(("exit", c)) => Kind::Exit(c.parse().map_err(|_| bad(item, "CODE"))?),
            Some(("sleep", s)) => Kind::Sleep(
                s.parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| bad(item, "SECONDS"))?,
            ),
            _ => return Err(bad(item, "unknown KIND")),
        };
        out.push(Fault { kind, phase, case });
    }
    Ok(out)
}

/// Fires the faults that match case `case` at `phase`.
pub fn trigger(faults: &[Fault], case: usize, phase: Phase) {
    for f in faults
        .iter()
        .filter(|f| f.phase == phase && f.case.is_none_or(|c| c == case))
    {
        match f.kind {
            Kind::Panic => panic!("{ENV}: panic at phase {} of case {case}", phase.as_str()),
            Kind::Abort => std::process::abort(),
            Kind::Kill => {
                // SAFETY: sends a signal to this process.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            Kind::Exit(code) => std::process::exit(code),
            Kind::Sleep(s) => std::thread::sleep(std::time::Duration::from_secs_f64(s)),
            Kind::Alloc => {
                let v: Vec<u8> = Vec::with_capacity(1 << 40);
                std::hint::black_box(&v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_kind_and_names_the_variable_in_errors() {
        let f = parse("panic@forward:2, sleep=1.5@init,alloc@backward,exit=3@inference").unwrap();
        assert_eq!(f.len(), 4);
        assert_eq!(f[0].kind, Kind::Panic);
        assert_eq!((f[0].phase, f[0].case), (Phase::Forward, Some(2)));
        assert_eq!(f[1].kind, Kind::Sleep(1.5));
        assert_eq!(f[1].case, None);
        assert_eq!(f[3].kind, Kind::Exit(3));
        for bad in [
            "panic",
            "panic@nowhere",
            "boom@init",
            "sleep=x@init",
            "panic@init:x",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.starts_with("MEMFIT_FAULT: "), "{e}");
        }
        assert!(parse("").unwrap().is_empty());
    }
}
