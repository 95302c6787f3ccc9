//! Numeric self-checks a build runs on a device: the fused kernels against candle's composed
//! ops ([`kernels`]), the backward block by block against the whole backward ([`backward`]) and
//! the in-place optimizer updates against the steps they replace ([`optim`]). They live in the library, not only in the test suite, so the one CUDA binary
//! that travels to a GPU machine can run them there (`memfit selftest --device cuda:0`, the
//! GPU call's first stage) without carrying test binaries of its own; `tests/selftest.rs` runs
//! the same functions, one test each, so the two cannot drift.
//!
//! Each check panics on a mismatch (with the figures) and prints its largest differences.
//! [`run`] runs one check on a device with its panic caught, so a failing check is reported
//! and the others still run.

pub mod backward;
pub mod kernels;
pub mod optim;

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use candle_core::Device;

/// One named check.
#[derive(Clone, Copy)]
pub struct Check {
    pub name: &'static str,
    /// `kernels`, `backward` or `optim`.
    pub group: &'static str,
    pub run: fn(),
}

macro_rules! checks {
    ($($group:ident :: $name:ident),* $(,)?) => {
        /// Every check, in the order `memfit selftest` runs them.
        pub const CHECKS: &[Check] = &[
            $(Check { name: stringify!($name), group: stringify!($group), run: $group::$name }),*
        ];
    };
}

checks![
    kernels::layer_norm_matches_layer_norm_slow,
    kernels::rms_norm_matches_rms_norm_slow,
    kernels::gelu_matches_candle_gelu,
    kernels::silu_mul_matches_silu_times_up,
    kernels::oss_glu_matches_its_composition,
    kernels::linear_matches_candle_nn_linear,
    kernels::linear_add_matches_the_projection_and_sum,
    kernels::moe_ops_match_their_compositions,
    kernels::frozen_linear_matches_a_matmul_on_its_weights,
    kernels::rotary_matches_apply_rotary,
    kernels::attn_probs_with_a_sliding_window,
    kernels::attn_probs_match_the_composed_softmax,
    kernels::wide_rows_match_the_composed_ops,
    kernels::efficient_attention_matches_the_composed_attention,
    kernels::tiled_attention_matches_the_composed_attention,
    kernels::grouped_attention_matches_repeated_keys,
    kernels::cross_entropy_matches_candle_nn,
    kernels::cross_entropy_refuses_a_target_beyond_the_vocabulary,
    kernels::gpt_fused_gradients_equal_composed,
    kernels::llama_fused_gradients_equal_composed,
    kernels::vit_fused_gradients_equal_composed,
    kernels::mla_absorbed_decode_matches_decompressed,
    backward::by_block_gradients_equal_the_whole_backward,
    optim::in_place_steps_equal_the_reference_steps,
    optim::in_place_steps_change_the_weights,
];

/// The check named `name`.
pub fn find(name: &str) -> Option<&'static Check> {
    CHECKS.iter().find(|c| c.name == name)
}

thread_local! {
    static DEVICE: RefCell<Option<Device>> = const { RefCell::new(None) };
}

/// The device under test on this thread (set by [`on_device`]; the CPU otherwise).
pub(crate) fn dev() -> Device {
    DEVICE.with(|d| d.borrow().clone().unwrap_or(Device::Cpu))
}

/// Runs `check` with `device` as the device under test; panics as the check does.
pub fn on_device(check: &Check, device: &Device) {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            DEVICE.with(|d| *d.borrow_mut() = None);
        }
    }
    DEVICE.with(|d| *d.borrow_mut() = Some(device.clone()));
    let _reset = Reset;
    (check.run)();
}

/// What one check did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    pub name: &'static str,
    pub group: &'static str,
    pub ok: bool,
    /// The panic's message when it failed.
    pub error: Option<String>,
    pub wall_s: f64,
}

/// Runs `check` on `device`, its panic caught and returned as the outcome's error.
pub fn run(check: &Check, device: &Device) -> Outcome {
    let t0 = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| on_device(check, device)));
    let error = result.err().map(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into())
    });
    Outcome {
        name: check.name,
        group: check.group,
        ok: error.is_none(),
        error,
        wall_s: t0.elapsed().as_secs_f64(),
    }
}
