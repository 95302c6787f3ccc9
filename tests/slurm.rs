//! The sweep on a real Slurm (Debian's slurm-wlm and munge on this machine, root needed):
//! `scripts/slurm-test.sh` starts a one-node cluster, runs a 4-task job array of a small CPU
//! workload with one task cancelled mid-case and requeued, merges, and compares with an
//! unsharded run; with the `ranks` feature, also a 2-rank case and a 2-stage pipeline, each as
//! one job step of 2 tasks. ≈ 35 s (plus the packages' install the first time).

#[test]
fn a_job_array_with_a_preempted_task_merges_to_the_unsharded_rows() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test starts slurmctld, slurmd and munged: run the suite as root (CI does)"
    );
    let o = std::process::Command::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-test.sh"),
    )
    .env("MEMFIT_BIN", env!("CARGO_BIN_EXE_memfit"))
    // A multi-rank case as one job step too, where memfit has MPI.
    .env(
        "MEMFIT_RANKS",
        if cfg!(feature = "ranks") { "1" } else { "0" },
    )
    .output()
    .unwrap();
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{log}");
    assert!(log.contains("every shard complete"), "{log}");
    assert!(
        log.contains("JobState=CANCELLED"),
        "a task was cancelled mid-case: {log}"
    );
    assert!(
        log.contains("OK: 48 rows, every case x phase once"),
        "{log}"
    );
    if cfg!(feature = "ranks") {
        assert!(log.contains("OK: ranks job step: 2 ranks"), "{log}");
        assert!(log.contains("OK: pipeline job step: 2 stages"), "{log}");
    }
}
