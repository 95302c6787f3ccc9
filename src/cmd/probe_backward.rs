//! `memfit probe backward`: each fused op's backward alone, in a window of the device's meters,
//! to tell what it holds beyond the gradients it returns (issue: backward temporaries against
//! PyTorch's single-kernel backward passes; `scripts/bench-op-backward.sh` runs the same ops in
//! PyTorch with `scripts/torch_op_backward.py` and writes the table of BENCHMARKS.md § 4).
//!
//! Per op, the inputs are made and the forward run before the window, with a gradient of the
//! output drawn at random; the window holds one call of the op's backward ([`Kernel::backward`],
//! or the efficient attention's `bwd`) and keeps the returned gradients until the meters are
//! read. So `peak_bytes` = the gradients returned + the backward's own temporaries at their
//! highest, and `temporary_bytes` = `peak_bytes` − `gradient_bytes`; both are also given per
//! element of the op's main input (`elements`: x, gate, or the attention's q·kᵀ scores), the
//! unit of the table. Shapes (`rows` × `width` for the row-wise ops and the loss; `heads` ×
//! `seq` × `head_dim` for the attention ops, one batch row, causal):
//!
//! | op | args | elements |
//! |---|---|---|
//! | layer-norm | x (rows, width), w, b (width) | rows·width |
//! | rms-norm | x (rows, width), w (width) | rows·width |
//! | gelu | x (rows, width) | rows·width |
//! | silu-mul | gate, up (rows, width) | rows·width |
//! | rotary | x (1, heads, seq, head_dim), cos, sin (seq, head_dim/2) | heads·seq·head_dim |
//! | cross-entropy | logits (rows, width), targets (rows) | rows·width |
//! | attn-probs | q, k (1, heads, seq, head_dim) → P (1, heads, seq, seq) | heads·seq² |
//! | efficient-attention | q, k, v (1, heads, seq, head_dim) (CPU only) | heads·seq·head_dim |

use candle_core::{CustomOp3, Tensor};

use crate::device::{DeviceSpec, ElemType};
use crate::model::kernels::{self, Kernel};

/// The ops the probe runs, in its order.
pub const OPS: [&str; 8] = [
    "layer-norm",
    "rms-norm",
    "gelu",
    "silu-mul",
    "rotary",
    "cross-entropy",
    "attn-probs",
    "efficient-attention",
];

/// The shapes of one probe.
#[derive(Debug, Clone, Copy)]
pub struct Shapes {
    pub rows: usize,
    pub width: usize,
    pub heads: usize,
    pub seq: usize,
    pub head_dim: usize,
}

/// What one op's backward held.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpBackward {
    pub op: String,
    pub device: String,
    pub dtype: String,
    pub threads: usize,
    pub peak_meter: String,
    /// Elements of the op's main input (the table's unit).
    pub elements: u64,
    /// The window's peak above what was allocated when it opened.
    pub peak_bytes: Option<u64>,
    /// The gradients the backward returned.
    pub gradient_bytes: u64,
    /// `peak_bytes − gradient_bytes`: the backward's own temporaries at their highest.
    pub temporary_bytes: Option<i64>,
    /// The replay's peak for the same call (the same generic backward on symbolic tensors,
    /// candle's per-tensor bookkeeping as 240 B each, gemm's packing buffer on the CPU); for
    /// the efficient attention its three gradients (its row statistics are not modelled).
    pub predicted_peak_bytes: u64,
    pub temporary_bytes_per_element: Option<f64>,
}

/// Runs `op`'s backward once in a window; `threads` already pinned.
pub fn op_backward(
    op: &str,
    device: DeviceSpec,
    dtype: ElemType,
    shapes: Shapes,
    threads: usize,
) -> anyhow::Result<OpBackward> {
    let mut meta = crate::machine::base_meta(String::new(), threads, "probe");
    let (mut meters, label) = crate::sweep::child::open_meters(device, true, false, &mut meta)?;
    let dev = device.candle()?;
    let dt = dtype.candle();
    let make = |dims: &[usize]| -> anyhow::Result<Tensor> {
        Ok(Tensor::randn(0f32, 1.0, dims, &dev)?.to_dtype(dt)?)
    };
    let Shapes {
        rows,
        width,
        heads,
        seq,
        head_dim,
    } = shapes;
    let scale = 1.0 / (head_dim as f32).sqrt();
    // The args, the forward's output, the elements, and how to run the backward.
    let (args, res, elements): (Vec<Tensor>, Tensor, usize) = match op {
        "layer-norm" => {
            let a = vec![make(&[rows, width])?, make(&[width])?, make(&[width])?];
            let y = kernels::layer_norm(&a[0], &a[1], &a[2], 1e-5)?;
            (a, y, rows * width)
        }
        "rms-norm" => {
            let a = vec![make(&[rows, width])?, make(&[width])?];
            let y = kernels::rms_norm(&a[0], &a[1], 1e-5)?;
            (a, y, rows * width)
        }
        "gelu" => {
            let a = vec![make(&[rows, width])?];
            let y = kernels::gelu(&a[0])?;
            (a, y, rows * width)
        }
        "silu-mul" => {
            let a = vec![make(&[rows, width])?, make(&[rows, width])?];
            let y = kernels::silu_mul(&a[0], &a[1])?;
            (a, y, rows * width)
        }
        "rotary" => {
            let half = head_dim / 2;
            let a = vec![
                make(&[1, heads, seq, head_dim])?,
                make(&[seq, half])?,
                make(&[seq, half])?,
            ];
            let y = kernels::rotary(&a[0], &a[1], &a[2])?;
            (a, y, heads * seq * head_dim)
        }
        "cross-entropy" => {
            let t: Vec<u32> = (0..rows).map(|i| (i * 7919 % width) as u32).collect();
            let a = vec![make(&[rows, width])?, Tensor::new(t, &dev)?];
            let y = kernels::cross_entropy(&a[0], &a[1])?;
            (a, y, rows * width)
        }
        "attn-probs" => {
            let a = vec![
                make(&[1, heads, seq, head_dim])?,
                make(&[1, heads, seq, head_dim])?,
            ];
            let y = kernels::attn_probs(&a[0], &a[1], scale, true, None)?;
            (a, y, heads * seq * seq)
        }
        "efficient-attention" => {
            if !matches!(device, DeviceSpec::Cpu) {
                anyhow::bail!("efficient-attention: a CPU op (CUDA runs the tiled composition)")
            }
            let a = vec![
                make(&[1, heads, seq, head_dim])?,
                make(&[1, heads, seq, head_dim])?,
                make(&[1, heads, seq, head_dim])?,
            ];
            let y = a[0].apply_op3_no_bwd(&a[1], &a[2], &efficient(scale))?;
            (a, y, heads * seq * head_dim)
        }
        other => anyhow::bail!("unknown op {other}: one of {}", OPS.join(", ")),
    };
    let grad = match op {
        "cross-entropy" => Tensor::ones((), dt, &dev)?,
        _ => make(res.dims())?,
    };
    let refs: Vec<&Tensor> = args.iter().collect();
    let predicted_peak_bytes = predicted(op, &refs, &res, &grad, scale, device, threads)?;
    dev.synchronize()?;
    let (grads, reading) = crate::meter::measure(&mut meters, || {
        let g: Vec<Option<Tensor>> = match op {
            "efficient-attention" => {
                let (a, b, c) = efficient(scale).bwd(refs[0], refs[1], refs[2], &res, &grad)?;
                vec![a, b, c]
            }
            _ => kernel(op, scale).backward(&refs, &res, &grad)?,
        };
        dev.synchronize()?;
        Ok(g)
    })?;
    let gradient_bytes: u64 = grads
        .iter()
        .flatten()
        .map(|g| (g.elem_count() * g.dtype().size_in_bytes()) as u64)
        .sum();
    drop(grads);
    let temporary_bytes = reading.peak_bytes.map(|p| p as i64 - gradient_bytes as i64);
    Ok(OpBackward {
        op: op.into(),
        device: device.to_string(),
        dtype: dtype.as_str().into(),
        threads,
        peak_meter: label.into(),
        elements: elements as u64,
        peak_bytes: reading.peak_bytes,
        gradient_bytes,
        temporary_bytes,
        temporary_bytes_per_element: temporary_bytes.map(|t| t as f64 / elements as f64),
        predicted_peak_bytes,
    })
}

/// The replay's peak of `op`'s backward on tensors shaped as `args`, `res` and `grad`.
fn predicted(
    op: &str,
    args: &[&Tensor],
    res: &Tensor,
    grad: &Tensor,
    scale: f32,
    device: DeviceSpec,
    threads: usize,
) -> anyhow::Result<u64> {
    use crate::formula::symbolic::{DType, Ledger, Sym};
    let cpu = matches!(device, DeviceSpec::Cpu);
    let ledger = Ledger::new(240, cpu.then_some(threads));
    let sym = |t: &Tensor, var: bool| {
        let d = DType::of(t.dtype());
        if var && t.dtype().is_float() {
            Sym::var(&ledger, t.dims(), d)
        } else {
            Sym::new(&ledger, t.dims(), d)
        }
    };
    let a: Vec<Sym> = args.iter().map(|t| sym(t, true)).collect();
    let (r, g) = (sym(res, false), sym(grad, false));
    let base = ledger.reset_peak();
    let grads: Vec<Option<Sym>> = if op == "efficient-attention" {
        a.iter()
            .map(|x| Some(Sym::new(&ledger, x.dims(), x.dtype())))
            .collect()
    } else {
        let refs: Vec<&Sym> = a.iter().collect();
        kernel(op, scale).backward(&refs, &r, &g)?
    };
    let peak = ledger.window_peak(base);
    drop(grads);
    Ok(peak)
}

fn efficient(scale: f32) -> crate::model::efficient_attention::EfficientAttention {
    crate::model::efficient_attention::EfficientAttention {
        scale,
        causal: true,
        window: 0,
    }
}

/// The [`Kernel`] whose backward `op` runs (every op but the efficient attention).
fn kernel(op: &str, scale: f32) -> Kernel {
    match op {
        "layer-norm" => Kernel::LayerNorm { eps: 1e-5 },
        "rms-norm" => Kernel::RmsNorm { eps: 1e-5 },
        "gelu" => Kernel::Gelu,
        "silu-mul" => Kernel::SiluMul { oss: false },
        "rotary" => Kernel::Rotary,
        "cross-entropy" => Kernel::CrossEntropy,
        _ => Kernel::AttnProbs {
            scale,
            causal: true,
            window: 0,
        },
    }
}

/// `memfit probe backward`: the ops asked for, one line (or JSON object) each.
pub fn probe(args: &crate::cli::ProbeBackwardArgs) -> anyhow::Result<()> {
    let (device, dtype) = crate::cmd::probe::device_and_dtype(&args.device, &args.dtype)?;
    // As `run` refuses it: candle's CPU matmul widens whole bf16 storages to f32, which no
    // measured case runs (and the replay does not model).
    if device == DeviceSpec::Cpu && dtype == ElemType::Bf16 {
        return Err(crate::error::UserError::OutOfRange {
            origin: "flags".into(),
            key: "dtype".into(),
            value: args.dtype.clone(),
            reason: "candle's CPU matmul has no bf16".into(),
            allowed: "f32, f16 on cpu; f32, bf16, f16 on cuda".into(),
        }
        .into());
    }
    for (key, v) in [
        ("rows", args.rows),
        ("width", args.width),
        ("heads", args.heads),
        ("seq", args.seq),
        ("head-dim", args.head_dim),
    ] {
        if !(1..=1 << 20).contains(&v) || (key == "head-dim" && v % 2 != 0) {
            return Err(crate::error::UserError::OutOfRange {
                origin: "flags".into(),
                key: key.into(),
                value: v.to_string(),
                reason: "a probe shape".into(),
                allowed: "1..=1048576 (head-dim even)".into(),
            }
            .into());
        }
    }
    let ops: Vec<String> = if args.op.is_empty() {
        OPS.iter().map(|s| s.to_string()).collect()
    } else {
        args.op.clone()
    };
    if let Some(bad) = ops.iter().find(|o| !OPS.contains(&o.as_str())) {
        return Err(crate::error::UserError::OutOfRange {
            origin: "flags".into(),
            key: "op".into(),
            value: bad.clone(),
            reason: "unknown op".into(),
            allowed: OPS.join(", "),
        }
        .into());
    }
    let threads = crate::cmd::probe::pinned_threads(args.threads)?;
    let shapes = Shapes {
        rows: args.rows,
        width: args.width,
        heads: args.heads,
        seq: args.seq,
        head_dim: args.head_dim,
    };
    for op in &ops {
        if op == "efficient-attention" && !matches!(device, DeviceSpec::Cpu) {
            eprintln!("efficient-attention: a CPU op (CUDA runs the tiled composition), skipped");
            continue;
        }
        let p = op_backward(op, device, dtype, shapes, threads)?;
        if args.json {
            println!("{}", serde_json::to_string(&p)?);
        } else {
            let b = |v: Option<u64>| v.map_or("—".to_string(), |v| format!("{v} B"));
            println!(
                "{} {} on {} ({} thread(s)), {}: peak {} (predicted {} B), gradients {} B, temporaries {} ({} B per element of {})",
                p.op,
                p.dtype,
                p.device,
                p.threads,
                p.peak_meter,
                b(p.peak_bytes),
                p.predicted_peak_bytes,
                p.gradient_bytes,
                p.temporary_bytes.map_or("—".into(), |v| format!("{v} B")),
                p.temporary_bytes_per_element
                    .map_or("—".into(), |v| format!("{v:.2}")),
                p.elements
            );
        }
    }
    Ok(())
}
