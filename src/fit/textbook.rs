//! The textbook formulas evaluated on stored measurements, beside memfit's own: each is a
//! function of one case's rows (grouped by run and case) that predicts one measured figure.
//!
//! - Korthikanti et al.: activations per layer `s·b·h·(34 + 5·a·s/h)` bytes in 16 bits, scaled
//!   to the element size, times L — against the forward's retained graph (raw), and on equal
//!   terms: without the dropout terms memfit's model does not have (the 1-byte masks `sbh` and
//!   `a·s²·b`, and the dropped-out softmax copy `2·a·s²·b`), i.e. `s·b·h·(32 + 2·a·s/h)`, plus
//!   what the paper leaves out and memfit's graph holds outside the blocks, counted separately:
//!   the embedding output and the final LayerNorm's input `2·e·BSH`, the logits and their
//!   log-softmax `2·e·BSV`. [`candle_extra`] itemises what candle keeps beyond that, in bytes.
//! - Adam keeps two copies (B2): state `2·e·P` (momentum `e·P`, SGD 0) — against the
//!   optimizer's retained bytes.
//! - Mixed precision "16 bytes per parameter" (weights, gradients, AdamW state) — against init +
//!   backward + optimizer retained of a mixed-precision AdamW case.
//! - The seed's "inference ≈ 2 × parameter memory" (N2) — against weights + inference peak.
//! - The KV cache `2·L·B·T·H·e` (N4) and with grouped-query attention's `2·L·B·T·G·D·e` —
//!   against the decode phase's retained bytes, on the rows they describe: a cache of keys and
//!   values per head (not MLA's latent) that the decode does not run past a window of.
//! - Megatron-LM's `theoretical_memory_usage` ([`megatron`]) and accelerate's
//!   `estimate-memory` ([`accelerate`]), the calculators users compare against, on the same
//!   rows.

use std::collections::BTreeMap;

use crate::record::{Row, Status};

/// One textbook formula's errors over the cases it applies to.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TextbookError {
    pub formula: &'static str,
    pub against: &'static str,
    pub cases: usize,
    pub mean_pct: f64,
    pub max_pct: f64,
}

fn elem_bytes(r: &Row) -> f64 {
    match r.dtype.as_str() {
        "f16" | "bf16" => 2.0,
        _ => 4.0,
    }
}

/// (formula, against, predicted, measured) for one case's rows.
type Check = (&'static str, &'static str, f64, f64);

fn checks(case: &BTreeMap<String, &Row>) -> Vec<Check> {
    let mut out = Vec::new();
    let get = |p: &str| case.get(p).copied();
    let retained = |r: &Row| r.retained_bytes.map(|v| v as f64);
    // A backward's gradients: by block it used the forward's graph up ([`Row::gradient_bytes`]).
    let gradients = |r: &Row| r.gradient_bytes(get("forward")).map(|v| v as f64);
    if let Some(f) = get("forward")
        && f.checkpoint == 0
        && let Some(m) = retained(f)
    {
        let (b, s, h, a, l) = (
            f.batch as f64,
            f.seq as f64,
            f.hidden as f64,
            f.heads as f64,
            f.layers as f64,
        );
        let e = elem_bytes(f);
        let k = l * s * b * h * (34.0 + 5.0 * a * s / h) * e / 2.0;
        out.push(("Korthikanti 34+5as/h", "forward graph", k, m));
        if f.model == "gpt" {
            let v = f.vocab as f64;
            let equal = l * s * b * h * (32.0 + 2.0 * a * s / h) * e / 2.0
                + e * (2.0 * b * s * h + 2.0 * b * s * v);
            out.push((
                "Korthikanti, no dropout, + embedding/head/loss",
                "forward graph",
                equal,
                m,
            ));
        }
    }
    if let Some(o) = get("optimizer")
        && o.lora_rank == 0
        && let Some(m) = retained(o)
    {
        let e = if o.precision == "mixed" {
            4.0
        } else {
            elem_bytes(o)
        };
        let p = o.params as f64;
        let k = match o.optimizer.as_str() {
            "adam" | "adamw" => Some(2.0 * e * p),
            "sgd-momentum" => Some(e * p),
            // SGD keeps no state: nothing to compare but bookkeeping.
            _ => None,
        };
        if let Some(k) = k
            && m > 0.0
        {
            out.push(("Adam 2×P (B2)", "optimizer state", k, m));
        }
    }
    if let (Some(i), Some(bw), Some(o)) = (get("init"), get("backward"), get("optimizer"))
        && o.optimizer == "adamw"
        && o.precision == "mixed"
        && let (Some(a), Some(b), Some(c)) = (retained(i), gradients(bw), retained(o))
    {
        out.push((
            "16 B/param (mixed AdamW)",
            "weights + grads + state",
            16.0 * i.params as f64,
            a + b + c,
        ));
    }
    if let (Some(i), Some(inf)) = (get("init"), get("inference"))
        && let (Some(w), Some(pk)) = (retained(i), inf.peak_bytes)
    {
        out.push((
            "inference ≈ 2×P (N2)",
            "weights + inference peak",
            2.0 * w,
            w + pk as f64,
        ));
    }
    // The KV formulas describe a cache of keys and values per head that grows with every
    // token: not MLA's latent (its per-token bytes are not `2·L·G·D·e`) nor a window the
    // decode runs past (the cache stops growing there).
    if let Some(d) = get("decode")
        && d.kv_cache == "on"
        && let Some(m) = retained(d)
        && kv_formula_applies(d)
    {
        // The cache has the serving activations' type: 16 bits for f16 serving weights and
        // for mixed precision's working copy.
        let e = if d.weights == "f16" || d.precision == "mixed" {
            2.0
        } else {
            elem_bytes(d)
        };
        let k =
            2.0 * d.layers as f64 * d.batch as f64 * d.decode_tokens as f64 * d.hidden as f64 * e;
        out.push(("KV cache 2·L·B·T·H·e (N4)", "decode cache growth", k, m));
        if let (Some(g), Some(dh)) = (d.kv_heads_or_heads(), d.head_dim_or_default()) {
            let k = k / d.hidden as f64 * (g * dh) as f64;
            out.push(("KV cache 2·L·B·T·G·D·e (GQA)", "decode cache growth", k, m));
        }
    }
    // The decoder's sizes, read once for both calculators (none for a ViT or an older LLaMA row).
    if let Some(dec) = case.values().next().and_then(|r| decoder(r)) {
        out.extend(megatron(case, &dec));
        out.extend(accelerate(case, &dec));
    }
    out
}

/// Whether `d`'s cache is keys and values per K/V head growing with every token: its recorded
/// per-token bytes are `2·L·G·D·e` (not MLA's latent), and the prompt and new tokens stay
/// within its window.
fn kv_formula_applies(d: &Row) -> bool {
    let e = if d.weights == "f16" || d.precision == "mixed" {
        2
    } else {
        elem_bytes(d) as u64
    };
    let per_head = match (d.kv_heads_or_heads(), d.head_dim_or_default()) {
        (Some(g), Some(dh)) => Some(2 * d.layers * g * dh * e),
        _ => None,
    };
    let latent = matches!((d.kv_bytes_per_token, per_head), (Some(k), Some(p)) if k != p);
    let past_window = d
        .sliding_window
        .is_some_and(|w| d.seq + d.decode_tokens > w);
    !latent && !past_window
}

/// The decoder's sizes Megatron and accelerate read from a config.
struct Decoder {
    h: f64,
    a: f64,
    g: f64,
    d: f64,
    i: f64,
    l: f64,
    v: f64,
    tied: bool,
    /// The LLaMA family: RMSNorm and SwiGLU.
    llama: bool,
}

/// A row's [`Decoder`]; `None` for a ViT or an older LLaMA row without the columns.
fn decoder(r: &Row) -> Option<Decoder> {
    if r.model == "vit" {
        return None;
    }
    let llama = r.model == "llama";
    let inter = match (r.intermediate, llama) {
        (0, true) => return None,
        (0, false) => 4 * r.hidden,
        (i, _) => i,
    };
    let tied = match r.tied.as_str() {
        "" if llama => return None,
        t => t == "on",
    };
    Some(Decoder {
        h: r.hidden as f64,
        a: r.heads as f64,
        g: r.kv_heads_or_heads()? as f64,
        d: r.head_dim_or_default()? as f64,
        i: inter as f64,
        l: r.layers as f64,
        v: r.vocab as f64,
        tied,
        llama,
    })
}

/// Megatron-LM's `theoretical_memory_usage.py` (no parallelism: t = p = 1, no distributed
/// optimizer), read as written there:
/// - parameters `L·(2·H·(I·g + n) + 2·H·(A·D + G·D)) + n·H + V·H·(2 untied | 1 tied)` with
///   `g = 3/2` for SwiGLU (LLaMA) else 1, `n` = 1 for RMSNorm else 2; it counts no linear
///   biases and no position table. Against the row's parameter count (the model memfit built).
/// - weights and optimizer state `18 B` per parameter (16-bit weights, f32 gradients, f32
///   master copy and Adam moments) — against weights + gradients + state of a mixed-precision
///   AdamW case.
/// - activations without sequence parallelism (`compute_activation_memory_without_sp`):
///   `L·s·b·h·34 + 8·s·b + s·b·h + 2·(s·b·V + s·b·h)`, times 1.05, bytes for 16-bit activations
///   (scaled to e/2 here, as Korthikanti's) — against the forward's retained graph.
fn megatron(case: &BTreeMap<String, &Row>, dec: &Decoder) -> Vec<Check> {
    let mut out = Vec::new();
    let &Decoder {
        h,
        a,
        g,
        d,
        i,
        l,
        v,
        tied,
        llama,
    } = dec;
    let (gate, norm) = if llama { (1.5, 1.0) } else { (1.0, 2.0) };
    let p = l * (2.0 * h * (i * gate + norm) + 2.0 * h * (a * d + g * d))
        + norm * h
        + v * h * if tied { 1.0 } else { 2.0 };
    let retained = |r: &Row| r.retained_bytes.map(|x| x as f64);
    let gradients = |r: &Row| {
        r.gradient_bytes(case.get("forward").copied())
            .map(|x| x as f64)
    };
    if let Some(init) = case.get("init") {
        out.push((
            "Megatron parameter count (GQA, SwiGLU)",
            "parameters of the built model",
            p,
            init.params as f64,
        ));
    }
    if let (Some(ini), Some(bw), Some(o)) = (
        case.get("init"),
        case.get("backward"),
        case.get("optimizer"),
    ) && o.optimizer == "adamw"
        && o.precision == "mixed"
        && o.lora_rank == 0
        && let (Some(x), Some(y), Some(z)) = (retained(ini), gradients(bw), retained(o))
    {
        out.push((
            "Megatron 18 B/param",
            "weights + grads + state",
            18.0 * p,
            x + y + z,
        ));
    }
    if let Some(f) = case.get("forward")
        && f.checkpoint == 0
        && f.lora_rank == 0
        && let Some(m) = retained(f)
    {
        let (b, s) = (f.batch as f64, f.seq as f64);
        let act = (l * s * b * h * 34.0 + 8.0 * s * b + s * b * h + 2.0 * (s * b * v + s * b * h))
            * 1.05
            * elem_bytes(f)
            / 2.0;
        out.push(("Megatron activations (no SP)", "forward graph", act, m));
    }
    out
}

/// Accelerate's `accelerate estimate-memory` (commands/estimate.py): the parameters of the
/// Hugging Face `AutoModel` (the base model: no LM head, so an untied head is not counted) at
/// the type's size is "Total Size" — against init's weights; "Training using Adam" is the
/// largest of its model, gradient, optimizer and step terms, `4 ×` the f32 size (16 B/param)
/// for float32 and `2 ×` the f32 size (8 B/param) for float16 — against weights + gradients +
/// state of a pure f32 or a mixed-precision AdamW case. It counts no activations.
fn accelerate(case: &BTreeMap<String, &Row>, dec: &Decoder) -> Vec<Check> {
    let mut out = Vec::new();
    let &Decoder { h, v, tied, .. } = dec;
    let retained = |r: &Row| r.retained_bytes.map(|x| x as f64);
    let gradients = |r: &Row| {
        r.gradient_bytes(case.get("forward").copied())
            .map(|x| x as f64)
    };
    if let Some(init) = case.get("init")
        && init.lora_rank == 0
        && init.precision != "mixed"
        && let Some(w) = retained(init)
    {
        let base = init.params as f64 - if tied { 0.0 } else { v * h };
        out.push((
            "accelerate estimate-memory: Total Size",
            "weights",
            base * elem_bytes(init),
            w,
        ));
        if let (Some(bw), Some(o)) = (case.get("backward"), case.get("optimizer"))
            && o.optimizer == "adamw"
            && o.lora_rank == 0
            && (o.dtype == "f32" || o.precision == "mixed")
            && let (Some(y), Some(z)) = (gradients(bw), retained(o))
        {
            let per = if o.precision == "mixed" { 8.0 } else { 16.0 };
            out.push((
                "accelerate estimate-memory: Training using Adam",
                "weights + grads + state",
                per * base,
                w + y + z,
            ));
        }
    }
    out
}

/// What candle's graph keeps (memfit's per-block accounting, `formula::transformer`) that the
/// paper's dropout-free accounting does not, per item, in bytes for the whole model, for a GPT
/// forward row with A > 1 and S > 1 (f32 elements; `None` otherwise). Per block the paper keeps
/// 16·BSH + A·B·S² elements (LayerNorm inputs and outputs, Q, K, V, the softmax output, the
/// o-projection input, GELU's input and output); memfit measures 39·BSH + 6·ABS² + 2·ABS +
/// 12·BS.
pub fn candle_extra(f: &Row) -> Option<Vec<(&'static str, f64)>> {
    if f.model != "gpt" || f.heads < 2 || f.seq < 2 || f.dtype != "f32" {
        return None;
    }
    let (b, s, h, a, l, v) = (
        f.batch as f64,
        f.seq as f64,
        f.hidden as f64,
        f.heads as f64,
        f.layers as f64,
        f.vocab as f64,
    );
    let (bsh, abs2, e) = (b * s * h, a * b * s * s, 4.0);
    Some(vec![
        (
            "unfused softmax chain: scores, scale, mask add, difference, exp (5·A·B·S²) and the row max and sum (2·A·B·S)",
            e * l * (5.0 * abs2 + 2.0 * a * b * s),
        ),
        (
            "LayerNorm's intermediates (`layer_norm_slow`: 3·BSH + 6·BS per norm, 2 per block)",
            e * l * (6.0 * bsh + 12.0 * b * s),
        ),
        (
            "matmul outputs before their bias add (q, k, v 3·BSH, o BSH, fc1 4·BSH, fc2 BSH)",
            e * l * 9.0 * bsh,
        ),
        (
            "head split/merge `contiguous()` copies (4·BSH)",
            e * l * 4.0 * bsh,
        ),
        (
            "projection outputs and residual sums (o and fc2 bias outputs, 2 residuals: 4·BSH)",
            e * l * 4.0 * bsh,
        ),
        (
            "outside the blocks beyond the equal-terms count: the position add and the final LayerNorm's intermediates (5·BSH + 6·BS), two more B·S·V tensors of the log-softmax and its max/sum/log (2·BSV + 4·BS), the causal mask (S²) and the 2 loss scalars",
            e * (5.0 * bsh + 10.0 * b * s + 2.0 * b * s * v + s * s + 2.0),
        ),
    ])
}

/// Every textbook formula's error over `rows` (ok rows grouped by run and case).
pub fn evaluate(rows: &[Row]) -> Vec<TextbookError> {
    let mut cases: BTreeMap<(String, u64), BTreeMap<String, &Row>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.status == Status::Ok) {
        cases
            .entry((r.run_id.clone(), r.case))
            .or_default()
            .insert(r.phase.to_string(), r);
    }
    let mut by: BTreeMap<(&'static str, &'static str), Vec<f64>> = BTreeMap::new();
    for case in cases.values() {
        for (f, a, k, m) in checks(case) {
            if m != 0.0 {
                by.entry((f, a))
                    .or_default()
                    .push(((k - m) / m).abs() * 100.0);
            }
        }
    }
    by.into_iter()
        .map(|((formula, against), e)| TextbookError {
            formula,
            against,
            cases: e.len(),
            mean_pct: e.iter().sum::<f64>() / e.len() as f64,
            max_pct: e.iter().fold(0f64, |m, x| m.max(*x)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(phase: &str, retained: i64, peak: u64) -> Row {
        let mut r = Row::example();
        r.phase = crate::step::Phase::parse(phase).expect("a phase");
        r.retained_bytes = Some(retained);
        r.peak_bytes = Some(peak);
        r
    }

    /// Worked by hand: L 3, B 2, S 8, H 16, A 2, f32: Korthikanti = 3·8·2·16·(34 + 5·2·8/16)·2
    /// = 3·256·39·2 = 59,904 B; against a graph of 49,920 B: 20 % off. Adam 2·4·1000 = 8000
    /// against 8000: 0 %. Inference 2 × 4000 = 8000 against 4000 + 1000: 60 % off.
    #[test]
    fn hand_worked_errors() {
        let rows = vec![
            row("init", 4000, 4000),
            row("forward", 49_920, 49_920),
            row("optimizer", 8000, 9000),
            row("inference", 100, 1000),
        ];
        let e = evaluate(&rows);
        let find = |f: &str| e.iter().find(|x| x.formula == f).unwrap();
        assert!((find("Korthikanti 34+5as/h").mean_pct - 20.0).abs() < 1e-9);
        assert_eq!(find("Adam 2×P (B2)").mean_pct, 0.0);
        assert!((find("inference ≈ 2×P (N2)").mean_pct - 60.0).abs() < 1e-9);
        // On equal terms: 3·8·2·16·(32 + 2·2·8/16)·2 = 768·34·2 = 52,224, plus
        // 4·(2·2·8·16 + 2·2·8·10) = 4·(512 + 320) = 3,328: 55,552 against 49,920 → 11.28 %.
        let eq = find("Korthikanti, no dropout, + embedding/head/loss").mean_pct;
        assert!(
            (eq - (55_552.0 / 49_920.0 - 1.0) * 100.0).abs() < 1e-9,
            "{eq}"
        );
    }

    /// Megatron and accelerate on hand-worked rows. GPT (L 3, B 2, S 8, H 16, A 2, V 10,
    /// f32, untied): Megatron's count 3·(2·16·(64 + 2) + 2·16·(16 + 16)) + 2·16 + 2·10·16 =
    /// 9,760; its activations (3·8·2·16·34 + 8·16 + 256 + 2·(160 + 256))·1.05·4/2 = 57,388.8
    /// against a graph of 49,920. accelerate's base model drops the untied head: (1000 − 160)
    /// params, 3,360 B against 4,000 of weights (16 %), and 16·840 = 13,440 against 4,000 +
    /// 4,000 + 8,000 (16 %).
    #[test]
    fn megatron_and_accelerate_by_hand() {
        let rows = vec![
            row("init", 4000, 4000),
            row("forward", 49_920, 49_920),
            row("backward", 4000, 4000),
            row("optimizer", 8000, 9000),
        ];
        let e = evaluate(&rows);
        let find = |f: &str| e.iter().find(|x| x.formula == f).unwrap().mean_pct;
        let pct = |k: f64, m: f64| ((k - m) / m).abs() * 100.0;
        assert!(
            (find("Megatron parameter count (GQA, SwiGLU)") - pct(9760.0, 1000.0)).abs() < 1e-9
        );
        assert!((find("Megatron activations (no SP)") - pct(57_388.8, 49_920.0)).abs() < 1e-9);
        assert!((find("accelerate estimate-memory: Total Size") - 16.0).abs() < 1e-9);
        assert!((find("accelerate estimate-memory: Training using Adam") - 16.0).abs() < 1e-9);
        // Mixed precision only: no 18 B/param row for a pure f32 case.
        assert!(e.iter().all(|x| x.formula != "Megatron 18 B/param"));
    }

    /// LLaMA without biases (H 16, A 2, G 1, D 8, I 24, L 3, V 10, untied): Megatron's count
    /// 3·(2·16·(24·3/2 + 1) + 2·16·(2·8 + 8)) + 16 + 2·160 = 6,192 equals the model's
    /// (embedding and head 320, final norm 16, per block 2·16 + 16·16 + 2·16·8 + 16·16 +
    /// 3·16·24 = 1,952): 0 %. With GQA the cache is 2·L·B·T·G·D·e: a growth of
    /// 2·3·2·4·8·4 = 1,536 B is exact; the seed's H form says 2× that.
    #[test]
    fn megatron_counts_llama_exactly_and_gqa_cache() {
        let llama = |phase: &str, retained: i64| {
            let mut r = row(phase, retained, retained as u64);
            r.model = "llama".into();
            (r.kv_heads, r.head_dim, r.intermediate) = (1, 8, 24);
            r.tied = "off".into();
            r.biases = "none".into();
            r.params = 6192;
            r.decode_tokens = 4;
            r.kv_cache = "on".into();
            r
        };
        let e = evaluate(&[llama("init", 24_768), llama("decode", 1536)]);
        let find = |f: &str| e.iter().find(|x| x.formula == f).unwrap().mean_pct;
        assert_eq!(find("Megatron parameter count (GQA, SwiGLU)"), 0.0);
        assert_eq!(find("KV cache 2·L·B·T·G·D·e (GQA)"), 0.0);
        assert_eq!(find("KV cache 2·L·B·T·H·e (N4)"), 100.0);
        // An older LLaMA row without the columns: no Megatron figure, never a guess.
        let mut old = llama("init", 24_768);
        (old.kv_heads, old.head_dim, old.intermediate) = (0, 0, 0);
        assert!(
            evaluate(&[old])
                .iter()
                .all(|x| !x.formula.starts_with("Megatron"))
        );
    }

    /// The itemised extra of one block set is memfit's accounting minus the paper's: per block
    /// (39 − 16)·BSH + (6 − 1)·ABS² + 2·ABS + 12·BS floats; a ViT or f16 row gets none.
    #[test]
    fn candle_extra_is_memfit_minus_the_paper() {
        let mut r = Row::example();
        r.phase = crate::step::Phase::Forward;
        let items = candle_extra(&r).unwrap();
        let blocks: f64 = items[..5].iter().map(|x| x.1).sum();
        let (bsh, abs2, abs, bs) = (256.0, 256.0, 32.0, 16.0);
        assert_eq!(
            blocks,
            4.0 * 3.0 * (23.0 * bsh + 5.0 * abs2 + 2.0 * abs + 12.0 * bs)
        );
        // Equal-terms count + every item = memfit's graph data to the byte (L 3, B 2, S 8,
        // H 16, A 2, V 10).
        let equal = 3.0 * 8.0 * 2.0 * 16.0 * (32.0 + 2.0 * 2.0 * 8.0 / 16.0) * 2.0
            + 4.0 * (2.0 * bsh + 2.0 * 2.0 * 8.0 * 10.0);
        let all: f64 = items.iter().map(|x| x.1).sum();
        let memfit = crate::formula::transformer::Shape::new(2, 8, 16, 2, 3, 10, 8)
            .activation_data_bytes() as f64;
        assert_eq!(equal + all, memfit);
        r.model = "vit".into();
        assert!(candle_extra(&r).is_none());
    }
}
