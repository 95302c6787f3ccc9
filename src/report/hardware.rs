//! Hardware comparison: the same configuration and phase across result sets (e.g. this CPU and
//! an H200), with peak memory, wall time, throughput and achieved FLOP/s against the device's
//! peak. FLOPs per phase come from [`crate::formula::flops`].

use crate::step::Phase;
use std::collections::BTreeMap;

use crate::formula::flops::{self, FlopCase};
use crate::record::{Row, Status};
use crate::report::claims::config_key_without;
use crate::units::human_bytes;

/// A device's peak dense FLOP/s for an element type, with where the number comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct Peak {
    pub flops: f64,
    pub source: String,
}

/// Datasheet peaks of known accelerators. NVIDIA H200 (SXM), from NVIDIA's H200 datasheet
/// (nvidia.com/en-us/data-center/h200, dense figures; the datasheet's headline numbers are
/// with 2:4 sparsity, twice these): BF16/FP16 tensor core 989 TFLOP/s, TF32 tensor core 494
/// TFLOP/s, FP32 67 TFLOP/s. candle's f32 matmul on CUDA does not enable TF32 by default, so
/// f32 rows are compared with the FP32 figure.
pub fn datasheet_peak(device_name: &str, dtype: &str) -> Option<Peak> {
    if !device_name.contains("H200") {
        return None;
    }
    let (t, what) = match dtype {
        "bf16" | "f16" => (989.0, "dense BF16/FP16 tensor core"),
        "f32" => (67.0, "FP32 (no TF32)"),
        _ => return None,
    };
    Some(Peak {
        flops: t * 1e12,
        source: format!("NVIDIA H200 datasheet, {what}"),
    })
}

/// Tokens a phase processes (for tokens/s): B·S for the full-sequence phases and the prefill,
/// B·T for decode.
pub fn tokens(r: &Row) -> Option<u64> {
    match r.phase.as_str() {
        "forward" | "backward" | "train-step" | "inference" | "prefill" => Some(r.batch * r.seq),
        "decode" => Some(r.batch * r.decode_tokens),
        _ => None,
    }
}

/// One result set as the comparison sees it.
pub struct SetView<'a> {
    pub label: &'a str,
    pub device_name: &'a str,
    pub rows: &'a [Row],
    /// Peak FLOP/s per element type, when known (datasheet or measured).
    pub peak: &'a dyn Fn(&str) -> Option<Peak>,
}

fn gflops(x: f64) -> String {
    if x >= 1e12 {
        format!("{:.1} TFLOP/s", x / 1e12)
    } else {
        format!("{:.2} GFLOP/s", x / 1e9)
    }
}

/// The comparison table: header and rows. Rows are (configuration, phase) present in at least
/// one set with a FLOP count; each set adds peak, wall, tokens/s, achieved FLOP/s, % of peak.
/// Also returns the largest achieved fraction of a peak (above 1: the peak is too low).
pub fn table(sets: &[SetView]) -> (Vec<String>, Vec<Vec<String>>, f64) {
    let mut top = 0f64;
    let mut head = vec!["configuration".to_string(), "phase".into(), "FLOPs".into()];
    for s in sets {
        for c in ["peak mem", "wall s", "tokens/s", "achieved", "% of peak"] {
            head.push(format!("{} {c}", s.label));
        }
    }
    // Configuration without run, device and threads: the same work on different machines.
    let key = |r: &Row| config_key_without(r, &["run", "device", "threads"]);
    let mut keys: BTreeMap<(String, String), (String, u64)> = BTreeMap::new();
    let mut cells: BTreeMap<((String, String), usize), &Row> = BTreeMap::new();
    for (i, s) in sets.iter().enumerate() {
        for r in s.rows.iter().filter(|r| r.status == Status::Ok) {
            let Ok(f) = FlopCase::of_row(r).phase(r.phase) else {
                continue;
            };
            let k = (key(r), r.phase.to_string());
            keys.entry(k.clone()).or_insert((describe(r), f));
            cells.entry((k, i)).or_insert(r);
        }
    }
    let mut rows = Vec::new();
    for (k, (desc, f)) in &keys {
        let mut line = vec![desc.clone(), k.1.clone(), format!("{:.3e}", *f as f64)];
        for (i, s) in sets.iter().enumerate() {
            match cells.get(&(k.clone(), i)) {
                None => line.extend(std::iter::repeat_n("—".to_string(), 5)),
                Some(r) => {
                    let achieved = flops::achieved(r).ok();
                    let peak = (s.peak)(&r.dtype);
                    line.push(r.peak_bytes.map_or("—".into(), |b| human_bytes(b as f64)));
                    line.push(r.wall_s.map_or("—".into(), |w| format!("{w:.3}")));
                    line.push(match (tokens(r), r.wall_s) {
                        (Some(t), Some(w)) if w > 0.0 => format!("{:.0}", t as f64 / w),
                        _ => "—".into(),
                    });
                    line.push(achieved.map_or("—".into(), gflops));
                    line.push(match (achieved, peak) {
                        (Some(a), Some(p)) => {
                            top = top.max(a / p.flops);
                            format!("{:.1} %", a / p.flops * 100.0)
                        }
                        _ => "unknown peak".into(),
                    });
                }
            }
        }
        rows.push(line);
    }
    (head, rows, top)
}

/// A short description of a row's configuration.
pub fn describe(r: &Row) -> String {
    if r.phase == Phase::Dataload {
        let n = |v: Option<u64>| v.map_or("—".into(), |x| x.to_string());
        return format!(
            "{} {}×{} prefetch {} persistent {} E{} B{} crop {}",
            r.storage,
            r.worker_kind,
            n(r.workers),
            n(r.prefetch),
            if r.persistent.is_empty() {
                "—"
            } else {
                &r.persistent
            },
            n(r.epochs),
            r.batch,
            n(r.crop_px)
        );
    }
    let shape = if r.preset == "custom" && r.model == "llama" && r.kv_heads > 0 {
        format!(
            "llama H{} A{} G{} D{} I{} L{} V{}",
            r.hidden, r.heads, r.kv_heads, r.head_dim, r.intermediate, r.layers, r.vocab
        )
    } else if r.preset == "custom" {
        format!("H{} A{} L{} V{}", r.hidden, r.heads, r.layers, r.vocab)
    } else {
        r.preset.clone()
    };
    let mut s = format!("{shape} B{} S{} {}", r.batch, r.seq, r.dtype);
    if r.precision == "mixed" {
        s.push_str(" mixed");
    }
    if r.attention == "efficient" {
        s.push_str(" efficient-attn");
    }
    if r.checkpoint > 0 {
        s.push_str(&format!(" ck{}", r.checkpoint));
    }
    if r.phase == Phase::Decode {
        s.push_str(&format!(" T{} cache {}", r.decode_tokens, r.kv_cache));
    }
    if !r.weights.is_empty()
        && r.weights != "model"
        && matches!(r.phase, Phase::Inference | Phase::Prefill | Phase::Decode)
    {
        s.push_str(&format!(" {}", r.weights));
    }
    if matches!(
        r.phase.as_str(),
        "init" | "forward" | "backward" | "train-step" | "optimizer"
    ) {
        s.push_str(&format!(" {}", r.optimizer));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h200_peaks_and_unknown_devices() {
        assert_eq!(datasheet_peak("NVIDIA H200", "bf16").unwrap().flops, 989e12);
        assert_eq!(datasheet_peak("NVIDIA H200", "f32").unwrap().flops, 67e12);
        assert!(datasheet_peak("cpu: AMD EPYC", "f32").is_none());
    }
}
