//! Unit helpers: human-readable bytes and UTC timestamps.

use crate::error::UserError;

/// `1536` → `1.50 KiB`; exact bytes below 1 KiB.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes;
    let mut i = 0;
    while v.abs() >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// Seconds since the Unix epoch → `YYYYMMDDTHHMMSSZ` (UTC).
pub fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-from-civil inverse.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The units [`parse_size`] accepts.
pub const SIZE_UNITS: &str = "B, KiB/K, MiB/M, GiB/G, TiB/T (binary: 1024^n), KB, MB, GB, TB \
                              (decimal: 1000^n), e.g. 80GiB, 512MiB, 1.5TB, 4096B";

/// A size from the command line: `80GiB`, `24G`, `512MiB`, `1.5TB`, `4096B`: binary units for
/// `Ki/Mi/Gi/Ti` and the bare letters, decimal for `KB/MB/GB/TB`. The unit is required (a bare
/// `80` could be bytes or GiB: refused, naming the units), and zero is refused as zero.
pub fn parse_size(s: &str, key: &str) -> Result<u64, UserError> {
    let bad = |reason: &str| UserError::OutOfRange {
        origin: "flags".into(),
        key: key.into(),
        value: s.into(),
        reason: reason.into(),
        allowed: format!("a positive number with a unit: {SIZE_UNITS}"),
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let x: f64 = num.parse().map_err(|_| bad("not a size"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" => return Err(bad("a size needs a unit (is 80 bytes, or 80 GiB?)")),
        "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(bad("unknown unit")),
    };
    if x == 0.0 {
        return Err(bad("zero: no case fits in no memory"));
    }
    if !x.is_finite() {
        return Err(bad("not a size"));
    }
    let bytes = (x * mult).round();
    if bytes < 1.0 {
        return Err(bad("less than one byte"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_known_dates() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        // 2026-12-02 10:35:49 UTC, worked out with `date -u -d @1796207749`.
        assert_eq!(utc_stamp(1_796_207_749), "20261202T103549Z");
        // Leap day 2024-02-29 12:00:00.
        assert_eq!(utc_stamp(1_709_208_000), "20240229T120000Z");
    }

    #[test]
    fn sizes_need_a_unit_and_are_not_zero() {
        assert_eq!(parse_size("80GiB", "k").unwrap(), 80 << 30);
        assert_eq!(parse_size("24G", "k").unwrap(), 24 << 30);
        assert_eq!(parse_size("1.5TB", "k").unwrap(), 1_500_000_000_000);
        assert_eq!(parse_size("4096B", "k").unwrap(), 4096);
        assert_eq!(parse_size(" 512 MiB ", "k").unwrap(), 512 << 20);
        for (bad, why) in [
            ("80", "needs a unit"),
            ("0", "needs a unit"),
            ("0GiB", "zero"),
            ("0.0B", "zero"),
            ("lots", "not a size"),
            ("80 parsecs", "unknown unit"),
            ("0.1B", "less than one byte"),
        ] {
            let e = parse_size(bad, "fit-in").unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(e.contains("GiB") && e.contains("fit-in"), "{bad}: {e}");
        }
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1536.0), "1.50 KiB");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0 * 1024.0), "3.00 GiB");
    }
}
