//! `memfit dataset make`: writes a deterministic synthetic image dataset (`crate::data::dataset`).

use crate::cli::{DatasetCommand, DatasetMakeArgs};
use crate::data::dataset::{self, Format, Spec};
use crate::error::UserError;

/// Largest side accepted, in pixels.
pub const MAX_PX: u32 = 8192;
/// Most images accepted.
pub const MAX_COUNT: usize = 1 << 22;

pub fn dataset(cmd: &DatasetCommand) -> anyhow::Result<()> {
    match cmd {
        DatasetCommand::Make(args) => make(args),
    }
}

/// The `--size` argument: `PX` or `MIN-MAX`, each in 1..=MAX_PX, MIN ≤ MAX.
pub fn parse_size(s: &str) -> Result<(u32, u32), UserError> {
    let bad = |reason: &str| UserError::OutOfRange {
        origin: "flags".into(),
        key: "size".into(),
        value: s.into(),
        reason: reason.into(),
        allowed: format!("PX or MIN-MAX, 1..={MAX_PX} px, MIN ≤ MAX"),
    };
    let num = |t: &str| -> Result<u32, UserError> {
        let v: u32 = t.trim().parse().map_err(|_| bad("not a pixel count"))?;
        if v == 0 || v > MAX_PX {
            return Err(bad("out of range"));
        }
        Ok(v)
    };
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (num(a)?, num(b)?),
        None => {
            let v = num(s)?;
            (v, v)
        }
    };
    if lo > hi {
        return Err(bad("MIN is above MAX"));
    }
    Ok((lo, hi))
}

fn make(args: &DatasetMakeArgs) -> anyhow::Result<()> {
    let (min_px, max_px) = parse_size(&args.size)?;
    if args.count == 0 || args.count > MAX_COUNT {
        return Err(UserError::OutOfRange {
            origin: "flags".into(),
            key: "count".into(),
            value: args.count.to_string(),
            reason: "a dataset needs images".into(),
            allowed: format!("1..={MAX_COUNT}"),
        }
        .into());
    }
    let mut formats = Vec::new();
    for f in &args.format {
        let parsed = Format::parse(f).ok_or_else(|| UserError::OutOfRange {
            origin: "flags".into(),
            key: "format".into(),
            value: f.clone(),
            reason: "unknown format".into(),
            allowed: "jpeg, png".into(),
        })?;
        formats.push(parsed);
    }
    let spec = Spec {
        seed: args.seed,
        count: args.count,
        min_px,
        max_px,
        formats,
    };
    let m = dataset::make(&args.out, &spec)?;
    let decoded: u64 = m
        .entries
        .iter()
        .map(|e| e.width as u64 * e.height as u64 * 3)
        .sum();
    println!(
        "wrote {} images ({}–{} px) to {}: pack.bin {} bytes (decoded RGB {} bytes), manifest.json, images/",
        m.entries.len(),
        min_px,
        max_px,
        args.out.display(),
        m.pack_bytes,
        decoded
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256").unwrap(), (256, 256));
        assert_eq!(parse_size("256-512").unwrap(), (256, 512));
        assert!(parse_size("512-256").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("9000").is_err());
    }
}
