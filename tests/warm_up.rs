//! The unmetered warm-up before a case's first window runs on a throwaway model of the case's
//! shape: a training step only when a training phase is asked. A serving-only case holds the
//! model and its serving activations, never gradients or optimizer state (which once made a
//! gpt-oss-20b serving slice need four times its weights and die in the warm-up). Measured with
//! the counting allocator memfit installs (one test in this binary: no other test allocates
//! beside it).

use candle_core::Device;
use memfit::meter::cpu_alloc;
use memfit::phase::runner::warm_up;
use memfit::workload::{self, GridSpec};

/// The case of a one-grid workload on the CPU: a GPT of 20.8 M parameters (V 8000, H 512, L 4)
/// at B 1 × S 8, so that the weights dwarf every activation.
fn case(phases: &str) -> workload::Case {
    let text = format!(
        r#"[defaults]
device = "cpu"
[[grid]]
preset = "small"
hidden = 512
layers = 4
vocab = 8000
batch = 1
seq = 8
optimizer = "adamw"
phases = [{phases}]
"#
    );
    let file = workload::parse(&text, "warm-up.toml").unwrap();
    let mut cases = workload::expand_for_prediction(&file, &GridSpec::default(), "w").unwrap();
    assert_eq!(cases.len(), 1);
    cases.remove(0)
}

/// The warm-up's peak above what was held before it.
fn warm_up_peak(case: &workload::Case) -> u64 {
    let before = cpu_alloc::current();
    cpu_alloc::reset_peak();
    warm_up(case, &Device::Cpu).unwrap();
    cpu_alloc::peak() - before
}

#[test]
fn the_warm_up_trains_only_for_training_phases() {
    let serving = case(r#""init", "inference", "prefill", "decode""#);
    let weights = 4 * serving.cfg.params();
    let training = case(r#""init", "forward", "backward", "optimizer", "train-step""#);
    let (s, t) = (warm_up_peak(&serving), warm_up_peak(&training));
    println!("weights {weights} B: serving warm-up {s} B, training warm-up {t} B");
    // Serving: the throwaway weights and a few small activations.
    assert!(s >= weights && s < weights + weights / 2, "serving: {s}");
    // Training: weights, gradients and AdamW's two moments at least.
    assert!(t >= 4 * weights, "training: {t}");
}
