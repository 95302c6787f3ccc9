//! Progress of a sweep on stderr: an indicatif bar (cases done / total, elapsed, ETA, the
//! current case) when stderr is a terminal; otherwise one plain line per finished case, for
//! logs; nothing with `--quiet`. The table of rows goes to stdout either way (the bar is
//! suspended while a line is printed).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::record::{Row, Status};

pub enum Progress {
    Quiet,
    Lines {
        total: usize,
        done: usize,
        start: Instant,
    },
    Bar(ProgressBar),
}

impl Progress {
    pub fn new(total: usize, quiet: bool) -> Self {
        if quiet {
            Progress::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} cases · {elapsed_precise} · ETA {eta} · {msg}",
                )
                .expect("a valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            Progress::Bar(bar)
        } else {
            Progress::Lines {
                total,
                done: 0,
                start: Instant::now(),
            }
        }
    }

    /// A case starts.
    pub fn start(&mut self, label: &str) {
        if let Progress::Bar(b) = self {
            b.set_message(format!("case {label}"));
        }
    }

    /// A case ended with `rows` after `seconds`.
    pub fn finish(&mut self, label: &str, rows: &[Row], seconds: f64) {
        match self {
            Progress::Quiet => {}
            Progress::Bar(b) => b.inc(1),
            Progress::Lines { total, done, start } => {
                *done += 1;
                let elapsed = start.elapsed().as_secs_f64();
                let eta = elapsed / *done as f64 * (*total - *done) as f64;
                eprintln!(
                    "memfit: [{done}/{total}] case {label}: {} in {seconds:.1} s · elapsed {elapsed:.0} s · ETA {eta:.0} s",
                    status_counts(rows)
                );
            }
        }
    }

    /// Prints a table line on stdout without breaking the bar.
    pub fn println(&self, line: &str) {
        match self {
            Progress::Quiet => {}
            Progress::Bar(b) => b.suspend(|| println!("{line}")),
            Progress::Lines { .. } => println!("{line}"),
        }
    }

    /// Prints a note on stderr without breaking the bar.
    pub fn note(&self, line: &str) {
        match self {
            Progress::Bar(b) => b.suspend(|| eprintln!("{line}")),
            _ => eprintln!("{line}"),
        }
    }

    pub fn done(&self) {
        if let Progress::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

/// `3 ok, 1 oom, 2 skipped`: the rows' statuses counted, in the order of [`Status::ALL`].
pub fn status_counts(rows: &[Row]) -> String {
    let parts: Vec<String> = Status::ALL
        .iter()
        .filter_map(|s| {
            let n = rows.iter().filter(|r| r.status == *s).count();
            (n > 0).then(|| format!("{n} {}", s.as_str()))
        })
        .collect();
    if parts.is_empty() {
        "no rows".into()
    } else {
        parts.join(", ")
    }
}
