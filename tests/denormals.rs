//! `--flush-denormals`: recorded in every row, on by default, the same memory either way, and
//! a clear error for a bad value; `--kernels`' refusals.

mod common;

use common::{exact_peak, memfit, run_rows};
use memfit::record::Status;

const TINY: &[&str] = &[
    "--preset",
    "tiny",
    "--batch",
    "2",
    "--seq",
    "16",
    "--phases",
    "forward,backward",
];

#[test]
fn the_setting_is_recorded_and_changes_no_memory() {
    let (off_dir, on_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut args = TINY.to_vec();
    args.extend(["--flush-denormals", "off"]);
    let off = run_rows(off_dir.path(), &args);
    // The default.
    let on = run_rows(on_dir.path(), TINY);
    assert_eq!(off.len(), 2);
    for (a, b) in off.iter().zip(&on) {
        assert_eq!(
            (a.flush_denormals.as_str(), b.flush_denormals.as_str()),
            ("off", "on")
        );
        assert_eq!((a.status, b.status), (Status::Ok, Status::Ok), "{b:?}");
        assert_eq!(a.peak_bytes, b.peak_bytes, "{}", a.phase);
        assert!(exact_peak(b), "{b:?}");
    }
}

#[test]
fn a_bad_value_names_the_key() {
    let out = memfit()
        .args(["run", "--preset", "tiny", "--flush-denormals", "sometimes"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("flush_denormals") && err.contains("on, off"),
        "{err}"
    );
}

/// `--kernels`: an unknown value is refused before anything runs, naming the key and what is
/// allowed; fused kernels on CUDA are accepted (they have a CUDA forward), and are the default
/// there as on the CPU.
#[test]
fn kernels_refusals_name_the_key() {
    let out = memfit()
        .args([
            "run",
            "--preset",
            "tiny",
            "--list-cases",
            "--kernels",
            "fast",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kernels") && err.contains("fused, composed"),
        "{err}"
    );
    for (args, composed) in [
        (&["--device", "cuda:0"][..], false),
        (&["--kernels", "fused", "--device", "cuda:0"], false),
        (&["--kernels", "composed", "--device", "cuda:0"], true),
    ] {
        let out = memfit()
            .args(["run", "--preset", "tiny", "--list-cases"])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(text.contains(" composed"), composed, "{args:?}: {text}");
    }
}
