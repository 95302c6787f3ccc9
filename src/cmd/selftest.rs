//! `memfit selftest`: the library's numeric self-checks (`crate::selftest`: the fused kernels
//! against candle's composed ops, the in-place optimizer steps against the reference ones) on
//! one device. The GPU call runs it first on `cuda:0`, with the binary that measures, so what
//! is checked is exactly what runs. Each check's panic is caught: every check runs, each is
//! reported `ok` or `FAILED` with its message, and the exit status is 1 if any failed.

use std::io::Write;

use anyhow::bail;

use crate::cli::SelftestArgs;
use crate::device::DeviceSpec;
use crate::error::UserError;
use crate::selftest::{self, CHECKS};

pub fn selftest(args: &SelftestArgs) -> anyhow::Result<()> {
    if args.list {
        for c in CHECKS {
            println!("{}::{}", c.group, c.name);
        }
        return Ok(());
    }
    let spec = DeviceSpec::from_flag(&args.device)?;
    if let Some(t) = args.threads {
        crate::machine::pin_threads(t)?;
    }
    let device = spec.candle()?;
    let chosen: Vec<_> = CHECKS
        .iter()
        .filter(|c| args.filter.iter().all(|f| c.name.contains(f.as_str())))
        .collect();
    if chosen.is_empty() {
        return Err(UserError::OutOfRange {
            origin: "flags".into(),
            key: "filter".into(),
            value: args.filter.join(", "),
            reason: "no check's name contains all of them".into(),
            allowed: "parts of the names `memfit selftest --list` prints".into(),
        }
        .into());
    }
    // The checks' own panics are caught and reported once, below; the default hook would print
    // each a second time with a backtrace hint.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut failed = Vec::new();
    for c in &chosen {
        println!("## {}::{} on {}", c.group, c.name, args.device);
        std::io::stdout().flush().ok();
        let o = selftest::run(c, &device);
        match &o.error {
            None => println!("ok {} ({:.2} s)", o.name, o.wall_s),
            Some(e) => {
                println!("FAILED {} ({:.2} s): {e}", o.name, o.wall_s);
                failed.push(o.name);
            }
        }
        if args.json {
            println!("{}", serde_json::to_string(&o)?);
        }
    }
    std::panic::set_hook(hook);
    println!(
        "selftest on {}: {} of {} checks ok{}",
        args.device,
        chosen.len() - failed.len(),
        chosen.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!("; failed: {}", failed.join(", "))
        }
    );
    if !failed.is_empty() {
        bail!("{} of {} self-checks failed", failed.len(), chosen.len());
    }
    Ok(())
}
