//! Prefill and decode: the key/value cache grows by exactly 2·L·B·H·e bytes per token, every
//! window is predicted, and decoding without a cache recomputes the prefix.

mod common;

use common::{exact_peak, exact_retained, run_rows};
use memfit::step::Phase;

fn rows(kv: &str, tokens: &str) -> Vec<memfit::record::Row> {
    let dir = tempfile::tempdir().unwrap();
    run_rows(
        dir.path(),
        &[
            "--batch",
            "3",
            "--seq",
            "21",
            "--hidden",
            "60",
            "--heads",
            "5",
            "--layers",
            "2",
            "--vocab",
            "200",
            "--phases",
            "prefill,decode",
            "--decode-tokens",
            tokens,
            "--kv-cache",
            kv,
        ],
    )
}

#[test]
fn cache_grows_by_the_formula_per_token() {
    for t in [1u64, 5, 12] {
        let r = rows("on", &t.to_string());
        let decode = r.iter().find(|r| r.phase == Phase::Decode).unwrap();
        // 2 (keys, values) × L × B × T × H × 4 bytes, nothing else stays.
        assert_eq!(
            decode.retained_bytes,
            Some((2 * 2 * 3 * t * 60 * 4) as i64),
            "{decode:?}"
        );
        assert_eq!(decode.decode_tokens, t);
        let prefill = r.iter().find(|r| r.phase == Phase::Prefill).unwrap();
        let cache = 2 * 2 * 3 * 21 * 60 * 4;
        let kept = prefill.retained_bytes.unwrap() as u64;
        assert!(kept >= cache && exact_retained(prefill), "{prefill:?}");
    }
}

#[test]
fn prefill_and_decode_are_predicted_with_and_without_cache() {
    for kv in ["on", "off"] {
        for r in rows(kv, "6") {
            assert_eq!(r.kv_cache, kv);
            assert!(
                exact_peak(&r),
                "{kv} {}: measured {:?} predicted {:?}",
                r.phase,
                r.peak_bytes,
                r.predicted_peak_bytes
            );
            assert!(
                exact_retained(&r),
                "{kv} {}: retained {:?} vs {:?}",
                r.phase,
                r.retained_bytes,
                r.predicted_retained_bytes
            );
        }
    }
}
