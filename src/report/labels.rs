//! Configuration labels that tell the rows of one table apart: [`hardware::describe`]'s short
//! label, then every case key that differs among the table's rows sharing that short label
//! (LoRA rank/targets/base, serving weights, KV cache, optimizer block, pipeline settings,
//! threads, …), so a key is shown exactly where the short label leaves rows alike. Rows that
//! still print the same label (the same configuration in two runs) get their workload's name,
//! then their run id.

use crate::step::Phase;
use std::collections::BTreeMap;

use crate::record::Row;
use crate::report::hardware;

/// The case keys of a row, in the order labels show them: (name as printed, value). An empty
/// value is "not applicable" and never printed.
fn keys(r: &Row) -> Vec<(&'static str, String)> {
    let opt = |v: Option<u64>| v.map_or(String::new(), |x| x.to_string());
    let custom = r.preset == "custom";
    // What `describe` already shows is left out (empty).
    let shown = |covered: bool, v: String| if covered { String::new() } else { v };
    let lora = if r.lora_rank > 0 {
        format!("r{} {} {}", r.lora_rank, r.lora_targets, r.lora_base)
    } else {
        "none".into()
    };
    let decode = r.phase == Phase::Decode;
    let serving = matches!(r.phase, Phase::Inference | Phase::Prefill | Phase::Decode);
    let data = r.phase == Phase::Dataload;
    vec![
        ("model", r.model.clone()),
        ("H", shown(custom, r.hidden.to_string())),
        ("A", shown(custom, r.heads.to_string())),
        ("L", shown(custom, r.layers.to_string())),
        ("V", shown(custom, r.vocab.to_string())),
        // 0: a row written before the column existed.
        ("G", opt(Some(r.kv_heads).filter(|&g| g > 0))),
        ("D", opt(Some(r.head_dim).filter(|&d| d > 0))),
        ("I", opt(Some(r.intermediate).filter(|&i| i > 0))),
        ("tied", r.tied.clone()),
        ("biases", r.biases.clone()),
        ("max S", r.max_seq.to_string()),
        ("image px", r.image_px.to_string()),
        ("patch px", r.patch_px.to_string()),
        ("device", r.device.clone()),
        ("optimizer", shown(!serving && !data, r.optimizer.clone())),
        ("8-bit block", r.optimizer_block.to_string()),
        ("precision", r.precision.clone()),
        ("attention", r.attention.clone()),
        (
            "checkpoint",
            shown(r.checkpoint > 0, r.checkpoint.to_string()),
        ),
        ("backward", shown(serving || data, r.backward.clone())),
        ("T", shown(decode, r.decode_tokens.to_string())),
        ("cache", shown(decode, r.kv_cache.clone())),
        (
            "weights",
            shown(serving && r.weights != "model", r.weights.clone()),
        ),
        ("load", r.load.clone()),
        ("LoRA", lora),
        ("storage", shown(data, r.storage.clone())),
        ("workers", shown(data, opt(r.workers))),
        ("kind", shown(data, r.worker_kind.clone())),
        ("prefetch", shown(data, opt(r.prefetch))),
        ("persistent", shown(data, r.persistent.clone())),
        ("epochs", shown(data, opt(r.epochs))),
        ("crop", shown(data, opt(r.crop_px))),
        ("threads", r.threads.to_string()),
    ]
}

/// One label per row of a table (same order): unique whenever the rows differ in any key, run
/// or case.
pub fn labels(rows: &[&Row], workload_of: &BTreeMap<String, String>) -> Vec<String> {
    let ks: Vec<Vec<(&str, String)>> = rows.iter().map(|r| keys(r)).collect();
    let base: Vec<String> = rows.iter().map(|r| hardware::describe(r)).collect();
    // Per short label: the keys that differ among its rows.
    let mut varies: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
    for (i, b) in base.iter().enumerate() {
        let first = base.iter().position(|x| x == b).expect("b is in base");
        let v = varies
            .entry(b.as_str())
            .or_insert_with(|| vec![false; ks[i].len()]);
        for (j, (_, val)) in ks[i].iter().enumerate() {
            v[j] |= *val != ks[first][j].1;
        }
    }
    let mut out: Vec<String> = base
        .iter()
        .zip(&ks)
        .map(|(b, k)| {
            let mut s = b.clone();
            for (j, (name, v)) in k.iter().enumerate() {
                if varies[b.as_str()][j] && !v.is_empty() {
                    s.push_str(&format!(" {name} {v}"));
                }
            }
            s
        })
        .collect();
    let suffixes: [&dyn Fn(&Row) -> String; 3] = [
        &|r| format!(" [{}]", workload_of.get(&r.run_id).unwrap_or(&r.run_id)),
        &|r| format!(" run {}", r.run_id),
        &|r| format!(" case {}", r.case),
    ];
    for suffix in suffixes {
        let mut count: BTreeMap<String, usize> = BTreeMap::new();
        for l in &out {
            *count.entry(l.clone()).or_default() += 1;
        }
        for (l, r) in out.iter_mut().zip(rows) {
            if count[l.as_str()] > 1 {
                l.push_str(&suffix(r));
            }
        }
    }
    out
}

/// Short labels for a picture: the preset (or `L·H` of a custom model), batch and sequence,
/// the type when not f32 and `mixed` under mixed precision; rows that would share a label get
/// the fields that tell them apart (optimizer, attention, kernels, checkpointing, backward,
/// LoRA), and are numbered (`#2`, …) only when none does.
pub fn short_labels(rows: &[&Row]) -> Vec<String> {
    let base: Vec<String> = rows
        .iter()
        .map(|r| {
            let model = if r.preset == "custom" {
                format!("{} L{} H{}", r.model, r.layers, r.hidden)
            } else {
                r.preset.clone()
            };
            let mut s = format!("{model} B{} S{}", r.batch, r.seq);
            if r.dtype != "f32" {
                s.push_str(&format!(" {}", r.dtype));
            }
            if r.precision == "mixed" {
                s.push_str(" mixed");
            }
            s
        })
        .collect();
    let fields: [&dyn Fn(&Row) -> String; 6] = [
        &|r| r.optimizer.clone(),
        &|r| r.attention.clone(),
        &|r| r.kernels.clone(),
        &|r| format!("ckpt{}", r.checkpoint),
        &|r| format!("{} backward", r.backward),
        &|r| format!("lora r{} {}", r.lora_rank, r.lora_base),
    ];
    let with_fields: Vec<String> = base
        .iter()
        .zip(rows)
        .map(|(b, r)| {
            let twins: Vec<&Row> = base
                .iter()
                .zip(rows)
                .filter(|(o, _)| *o == b)
                .map(|(_, o)| *o)
                .collect();
            let mut l = b.clone();
            if twins.len() > 1 {
                for f in &fields {
                    if twins.iter().any(|t| f(t) != f(r)) {
                        l.push_str(&format!(" {}", f(r)));
                    }
                }
            }
            l
        })
        .collect();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    with_fields
        .iter()
        .map(|b| {
            let n = seen.entry(b.as_str()).or_insert(0);
            *n += 1;
            if *n == 1 {
                b.clone()
            } else {
                format!("{b} #{n}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two LoRA cases and a full one of the same shape: the LoRA key is shown (it differs), the
    /// threads are not (equal); the same case in two runs gets the workload's name.
    #[test]
    fn differing_keys_are_shown_and_duplicates_told_apart() {
        let full = Row::example();
        let mut a = Row::example();
        a.lora_rank = 8;
        a.lora_targets = "q,v".into();
        a.lora_base = "op".into();
        let mut b = a.clone();
        b.lora_base = "q4_0".into();
        let mut again = full.clone();
        again.run_id = "s".into();
        let rows = [&full, &a, &b, &again];
        let w = BTreeMap::from([
            ("r".into(), "seed-lora".into()),
            ("s".into(), "default".into()),
        ]);
        let l = labels(&rows, &w);
        assert!(l[1].ends_with("LoRA r8 q,v op"), "{l:?}");
        assert!(l[2].ends_with("LoRA r8 q,v q4_0"), "{l:?}");
        assert!(
            l[0].contains("LoRA none [seed-lora]") && l[3].ends_with("[default]"),
            "{l:?}"
        );
        assert!(!l[0].contains("threads"));
        let mut u = l.clone();
        u.sort();
        u.dedup();
        assert_eq!(u.len(), 4);
    }
}
