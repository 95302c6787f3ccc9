//! The library's numeric self-checks (`memfit::selftest`: the fused kernels against candle's
//! composed ops, the in-place optimizer steps against the reference ones), one test each, on
//! the CPU or the device `MEMFIT_TEST_DEVICE` names. `memfit selftest --device cuda:0` runs the
//! same functions on the GPU machine; `every_check_has_a_test` keeps this list and the
//! library's in step.

use memfit::selftest;

mod common;

fn check(name: &str) {
    let c = selftest::find(name).unwrap_or_else(|| panic!("no self-check {name}"));
    selftest::on_device(c, &common::test_device());
}

#[test]
fn layer_norm_matches_layer_norm_slow() {
    check("layer_norm_matches_layer_norm_slow");
}

#[test]
fn rms_norm_matches_rms_norm_slow() {
    check("rms_norm_matches_rms_norm_slow");
}

#[test]
fn gelu_matches_candle_gelu() {
    check("gelu_matches_candle_gelu");
}

#[test]
fn silu_mul_matches_silu_times_up() {
    check("silu_mul_matches_silu_times_up");
}

#[test]
fn oss_glu_matches_its_composition() {
    check("oss_glu_matches_its_composition");
}

#[test]
fn linear_matches_candle_nn_linear() {
    check("linear_matches_candle_nn_linear");
}

#[test]
fn frozen_linear_matches_a_matmul_on_its_weights() {
    check("frozen_linear_matches_a_matmul_on_its_weights");
}

#[test]
fn rotary_matches_apply_rotary() {
    check("rotary_matches_apply_rotary");
}

#[test]
fn attn_probs_with_a_sliding_window() {
    check("attn_probs_with_a_sliding_window");
}

#[test]
fn attn_probs_match_the_composed_softmax() {
    check("attn_probs_match_the_composed_softmax");
}

#[test]
fn wide_rows_match_the_composed_ops() {
    check("wide_rows_match_the_composed_ops");
}

#[test]
fn efficient_attention_matches_the_composed_attention() {
    check("efficient_attention_matches_the_composed_attention");
}

#[test]
fn tiled_attention_matches_the_composed_attention() {
    check("tiled_attention_matches_the_composed_attention");
}

#[test]
fn grouped_attention_matches_repeated_keys() {
    check("grouped_attention_matches_repeated_keys");
}

#[test]
fn linear_add_matches_the_projection_and_sum() {
    check("linear_add_matches_the_projection_and_sum");
}

#[test]
fn moe_ops_match_their_compositions() {
    check("moe_ops_match_their_compositions");
}

#[test]
fn cross_entropy_matches_candle_nn() {
    check("cross_entropy_matches_candle_nn");
}

#[test]
fn cross_entropy_refuses_a_target_beyond_the_vocabulary() {
    check("cross_entropy_refuses_a_target_beyond_the_vocabulary");
}

#[test]
fn gpt_fused_gradients_equal_composed() {
    check("gpt_fused_gradients_equal_composed");
}

#[test]
fn llama_fused_gradients_equal_composed() {
    check("llama_fused_gradients_equal_composed");
}

#[test]
fn vit_fused_gradients_equal_composed() {
    check("vit_fused_gradients_equal_composed");
}

#[test]
fn mla_absorbed_decode_matches_decompressed() {
    check("mla_absorbed_decode_matches_decompressed");
}

#[test]
fn by_block_gradients_equal_the_whole_backward() {
    check("by_block_gradients_equal_the_whole_backward");
}

#[test]
fn in_place_steps_equal_the_reference_steps() {
    check("in_place_steps_equal_the_reference_steps");
}

#[test]
fn in_place_steps_change_the_weights() {
    check("in_place_steps_change_the_weights");
}

const TESTED: &[&str] = &[
    "layer_norm_matches_layer_norm_slow",
    "rms_norm_matches_rms_norm_slow",
    "gelu_matches_candle_gelu",
    "silu_mul_matches_silu_times_up",
    "oss_glu_matches_its_composition",
    "linear_matches_candle_nn_linear",
    "linear_add_matches_the_projection_and_sum",
    "moe_ops_match_their_compositions",
    "frozen_linear_matches_a_matmul_on_its_weights",
    "rotary_matches_apply_rotary",
    "attn_probs_with_a_sliding_window",
    "attn_probs_match_the_composed_softmax",
    "wide_rows_match_the_composed_ops",
    "efficient_attention_matches_the_composed_attention",
    "tiled_attention_matches_the_composed_attention",
    "grouped_attention_matches_repeated_keys",
    "cross_entropy_matches_candle_nn",
    "cross_entropy_refuses_a_target_beyond_the_vocabulary",
    "gpt_fused_gradients_equal_composed",
    "llama_fused_gradients_equal_composed",
    "vit_fused_gradients_equal_composed",
    "mla_absorbed_decode_matches_decompressed",
    "by_block_gradients_equal_the_whole_backward",
    "in_place_steps_equal_the_reference_steps",
    "in_place_steps_change_the_weights",
];

#[test]
fn every_check_has_a_test() {
    let lib: Vec<&str> = selftest::CHECKS.iter().map(|c| c.name).collect();
    assert_eq!(
        lib, TESTED,
        "a self-check without its test here, or the reverse"
    );
}

/// A failing check is caught, reported with its message, and does not stop the next one.
#[test]
fn a_failing_check_is_reported_not_fatal() {
    fn broken() {
        panic!("outputs differ by 0.5");
    }
    let c = selftest::Check {
        name: "broken",
        group: "kernels",
        run: broken,
    };
    let o = selftest::run(&c, &candle_core::Device::Cpu);
    assert!(!o.ok);
    assert_eq!(o.error.as_deref(), Some("outputs differ by 0.5"));
    let next = selftest::run(
        selftest::find("in_place_steps_change_the_weights").unwrap(),
        &candle_core::Device::Cpu,
    );
    assert!(next.ok, "{next:?}");
}

/// `memfit selftest` runs the chosen checks and says how many passed; a filter that matches
/// nothing is refused with the flag named.
#[test]
fn the_command_runs_the_chosen_checks() {
    let o = common::memfit()
        .args(["selftest", "--filter", "in_place", "--threads", "1"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("selftest on cpu: 2 of 2 checks ok"), "{out}");
    assert!(
        out.contains("ok in_place_steps_change_the_weights"),
        "{out}"
    );

    let o = common::memfit()
        .args(["selftest", "--list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&o.stdout).lines().count();
    assert_eq!(listed, selftest::CHECKS.len());

    let o = common::memfit()
        .args(["selftest", "--filter", "no-such-check"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("`filter`") && err.contains("no-such-check"),
        "{err}"
    );
}
