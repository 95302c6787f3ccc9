//! Records the git commit and the candle version for the run metadata; with the `cuda` feature,
//! compiles the fused kernels' CUDA source (`src/model/kernels/fused.cu`) to PTX with nvcc for
//! `CUDA_COMPUTE_CAP` (the variable candle-kernels' build needs too).
use std::path::PathBuf;
use std::process::Command;

/// `nvcc --ptx` of the fused kernels into `$OUT_DIR/fused.ptx`.
fn cuda_ptx() {
    let src = "src/model/kernels/fused.cu";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=NVCC");
    let cap = std::env::var("CUDA_COMPUTE_CAP")
        .expect("the cuda feature needs CUDA_COMPUTE_CAP (e.g. 90; see scripts/build-cuda.sh)");
    let cap: String = cap.chars().filter(|c| c.is_ascii_digit()).collect();
    let nvcc = std::env::var("NVCC")
        .or_else(|_| std::env::var("CUDA_HOME").map(|h| format!("{h}/bin/nvcc")))
        .unwrap_or_else(|_| "nvcc".into());
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("fused.ptx");
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3", &format!("-arch=sm_{cap}"), src, "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running {nvcc} for {src}: {e}"));
    assert!(status.success(), "{nvcc} --ptx {src} failed ({status})");
}

fn main() {
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        cuda_ptx();
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    let commit = if dirty && commit != "unknown" {
        format!("{commit}-dirty")
    } else {
        commit
    };
    println!("cargo:rustc-env=MEMFIT_GIT_COMMIT={commit}");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let candle = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"candle-core\""))
        .and_then(|p| p.lines().find(|l| l.starts_with("version = ")))
        .map(|l| {
            l.trim_start_matches("version = ")
                .trim_matches('"')
                .to_string()
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MEMFIT_CANDLE_VERSION={candle}");
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
}
