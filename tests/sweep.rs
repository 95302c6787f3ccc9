//! The sweep loses nothing: each case runs in a process of its own, so a killed, panicking,
//! out-of-memory or hung case costs only itself; SIGINT stops after the running case, a
//! second one kills it; an unwritable folder or a full disk stop the sweep with the journal
//! whole; `--resume` then completes it with every case's rows exactly once. Faults are made
//! with the test-only switch `MEMFIT_FAULT` (`memfit::sweep::fault`).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use memfit::record::{Row, Status};

const CASES: &[&str] = &[
    "--model",
    "gpt",
    "--seq",
    "8",
    "--hidden",
    "16",
    "--heads",
    "2",
    "--layers",
    "2",
    "--vocab",
    "50",
    "--batch",
    "1,2,3",
    "--threads",
    "1",
];
const PHASES: usize = 6;

fn memfit() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memfit"));
    c.env("RAYON_NUM_THREADS", "1").env_remove("MEMFIT_FAULT");
    c
}

fn run(out: &Path, extra: &[&str], fault: Option<&str>) -> std::process::Output {
    let mut c = memfit();
    c.arg("run").args(CASES).args(extra).arg("--out").arg(out);
    if let Some(f) = fault {
        c.env("MEMFIT_FAULT", f);
    }
    c.output().expect("memfit runs")
}

fn rows(out: &Path) -> Vec<Row> {
    memfit::store::jsonl::read(&out.join("results.jsonl")).expect("the journal reads")
}

fn by_case(rows: &[Row]) -> HashMap<u64, Vec<&Row>> {
    let mut m: HashMap<u64, Vec<&Row>> = HashMap::new();
    for r in rows {
        m.entry(r.case).or_default().push(r);
    }
    m
}

/// Every case of CASES has one row per phase, all `ok`, none twice.
fn complete_once(out: &Path) {
    let rows = rows(out);
    let mut seen = HashMap::new();
    for r in &rows {
        *seen.entry((r.case, r.phase)).or_insert(0) += 1;
        assert_eq!(
            r.status,
            Status::Ok,
            "case {} {}: {:?}",
            r.case,
            r.phase,
            r.error
        );
    }
    assert_eq!(seen.len(), 3 * PHASES, "every case × phase");
    assert!(seen.values().all(|&n| n == 1), "a row twice: {seen:?}");
    // The derived stores follow the journal.
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + rows.len());
}

fn statuses(rows: &[&Row]) -> Vec<Status> {
    rows.iter().map(|r| r.status).collect()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_killed_case_is_recorded_crashed_and_resume_runs_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(&out, &["--quiet"], Some("kill@backward:1"));
    // Every row written, and the exit status says that one case did not measure.
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("1 crashed"), "{}", stderr(&o));
    let all = rows(&out);
    let cases = by_case(&all);
    assert_eq!(
        all.len(),
        3 * PHASES,
        "one row per asked phase, even for the killed case"
    );
    use Status::*;
    assert_eq!(
        statuses(&cases[&1]),
        [Ok, Ok, Crashed, Skipped, Skipped, Skipped]
    );
    let crashed = cases[&1][2];
    assert!(
        crashed.error.as_deref().unwrap().contains("SIGKILL"),
        "{:?}",
        crashed.error
    );
    assert_eq!(
        crashed.peak_bytes, None,
        "no figure for what did not finish"
    );
    // The phases that finished before the kill kept their measurements.
    assert!(cases[&1][1].peak_bytes.unwrap() > 0);
    assert!(cases[&0].iter().chain(&cases[&2]).all(|r| r.status == Ok));

    let o = run(&out, &["--quiet", "--resume"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    complete_once(&out);
    let aside = memfit::store::jsonl::read(&out.join("superseded.jsonl")).unwrap();
    assert_eq!(aside.len(), PHASES, "the killed case's old rows, set aside");
    assert!(aside.iter().all(|r| r.case == 1));
    // A second resume finds nothing to do.
    let before = std::fs::read(out.join("results.jsonl")).unwrap();
    let o = run(&out, &["--resume"], None);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 of 3 case(s) finished, 0 to run"));
    assert_eq!(std::fs::read(out.join("results.jsonl")).unwrap(), before);
}

#[test]
fn a_panic_costs_only_its_case_and_its_message_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = run(&out, &["--quiet"], Some("panic@forward:0"));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let all = rows(&out);
    let cases = by_case(&all);
    use Status::*;
    assert_eq!(
        statuses(&cases[&0]),
        [Ok, Crashed, Skipped, Skipped, Skipped, Skipped]
    );
    let e = cases[&0][1].error.as_deref().unwrap();
    assert!(e.contains("panicked") && e.contains("exit code 101"), "{e}");
    assert!(
        cases[&0][3]
            .error
            .as_deref()
            .unwrap()
            .starts_with("not run: phase forward")
    );
    assert!(cases[&1].iter().chain(&cases[&2]).all(|r| r.status == Ok));
}

#[test]
fn a_budget_oom_is_oom_and_the_sweep_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // Batch 1 fits in 48 MiB; batch 96's logits alone are 96·128·500·4 B = 24.6 MB, several
    // times over in the training step.
    let o = memfit()
        .args([
            "run", "--model", "gpt", "--seq", "128", "--hidden", "32", "--heads", "2",
        ])
        .args([
            "--layers",
            "1",
            "--vocab",
            "500",
            "--batch",
            "96,1",
            "--threads",
            "1",
        ])
        .args(["--mem-budget", "48MiB", "--quiet", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("1 oom"), "{}", stderr(&o));
    let all = rows(&out);
    let cases = by_case(&all);
    use Status::*;
    // The warm-up (a whole training step) runs out first: the first phase says so.
    assert_eq!(
        statuses(&cases[&0]),
        [Oom, Skipped, Skipped, Skipped, Skipped, Skipped]
    );
    let e = cases[&0][0].error.as_deref().unwrap();
    assert!(
        e.contains("memory allocation of") && e.contains("warm-up"),
        "{e}"
    );
    assert!(cases[&1].iter().all(|r| r.status == Ok), "{:?}", cases[&1]);
}

#[test]
fn a_case_past_its_time_limit_is_killed_as_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let t = Instant::now();
    let o = run(
        &out,
        &["--quiet", "--case-timeout", "3"],
        Some("sleep=60@optimizer:1"),
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        t.elapsed() < Duration::from_secs(50),
        "the sleeping case was not killed"
    );
    let all = rows(&out);
    let cases = by_case(&all);
    use Status::*;
    assert_eq!(
        statuses(&cases[&1]),
        [Ok, Ok, Ok, Timeout, Skipped, Skipped]
    );
    assert!(
        cases[&1][3]
            .error
            .as_deref()
            .unwrap()
            .contains("--case-timeout")
    );
    assert!(cases[&2].iter().all(|r| r.status == Ok));
    // A timeout is not final: resume runs the case again.
    let o = run(&out, &["--quiet", "--resume"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    complete_once(&out);
}

/// True when the process of case N of the run into `out` exists (`memfit run … --out OUT
/// --child-case N`; other tests run at the same time).
fn child_case_running(out: &Path, n: usize) -> bool {
    let case = format!("--child-case\0{n}\0");
    let dir = format!("--out\0{}\0", out.display());
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains(&case) && c.contains(&dir)
            })
            .unwrap_or(false)
    })
}

/// Starts `memfit run` in the background, waits until case 1's process runs, sends
/// `signals` SIGINTs 300 ms apart, and returns its output.
fn interrupt(out: &Path, fault: &str, signals: usize) -> std::process::Output {
    let mut c = memfit();
    c.arg("run").args(CASES).arg("--out").arg(out);
    c.env("MEMFIT_FAULT", fault)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    // Case 1's process is running (its fault makes it slow): the signal lands mid-case.
    let t = Instant::now();
    while !child_case_running(out, 1) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "case 1 never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..signals {
        // SAFETY: signals the child we started.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        std::thread::sleep(Duration::from_millis(300));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn sigint_stops_after_the_running_case_and_resume_completes_the_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = interrupt(&out, "sleep=2@forward:1", 1);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("--resume"), "{err}");
    let all = rows(&out);
    let cases = by_case(&all);
    // Case 1 was running: it finished; case 2 never started.
    assert!(
        cases[&1].iter().all(|r| r.status == Status::Ok),
        "{:?}",
        cases[&1]
    );
    assert!(!cases.contains_key(&2));
    assert!(out.join("results.h5").exists() && out.join("results.csv").exists());

    let o = run(&out, &["--resume"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("2 of 3 case(s) finished, 1 to run"));
    complete_once(&out);
}

#[test]
fn a_second_sigint_kills_the_running_case_as_crashed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let t = Instant::now();
    let o = interrupt(&out, "sleep=60@forward:1", 2);
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(
        t.elapsed() < Duration::from_secs(50),
        "the running case was not killed"
    );
    let all = rows(&out);
    let cases = by_case(&all);
    use Status::*;
    assert_eq!(
        statuses(&cases[&1]),
        [Ok, Crashed, Skipped, Skipped, Skipped, Skipped]
    );
    assert!(
        cases[&1][1]
            .error
            .as_deref()
            .unwrap()
            .contains("second SIGINT")
    );
    let o = run(&out, &["--quiet", "--resume"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    complete_once(&out);
}

#[test]
fn resume_without_out_is_refused() {
    // Run in an empty folder: nothing may be created there.
    let dir = tempfile::tempdir().unwrap();
    let o = memfit()
        .current_dir(dir.path())
        .arg("run")
        .args(CASES)
        .args(["--quiet", "--resume"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("resume") && err.contains("--out"), "{err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no run started"
    );
}

#[test]
fn an_unwritable_out_is_an_error_before_any_case_runs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a folder").unwrap();
    let out = file.join("out");
    let o = run(&out, &["--quiet"], None);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains(&out.display().to_string()), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_full_disk_stops_the_sweep_and_resume_completes_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // 16 blocks of 512 bytes: the journal fills up in the second or third case.
    let mut args: Vec<String> = CASES.iter().map(|s| s.to_string()).collect();
    args.extend(["--quiet".into(), "--out".into(), out.display().to_string()]);
    let o = Command::new("bash")
        .arg("-c")
        .arg("ulimit -f 16; exec \"$0\" run \"$@\"")
        .arg(env!("CARGO_BIN_EXE_memfit"))
        .args(&args)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("File too large") && err.contains("--resume"),
        "{err}"
    );
    let (kept, _torn) = memfit::store::jsonl::read_lenient(&out.join("results.jsonl")).unwrap();
    assert!(kept.len() >= PHASES, "the cases before the limit are kept");

    let o = run(&out, &["--quiet", "--resume"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    complete_once(&out);
}

#[test]
fn the_deadline_leaves_out_what_would_not_finish_and_resume_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // Case 0 takes 3 s; the next ones, the same size, are estimated at 1.25 × that, more than
    // is left of a 5 s deadline.
    let o = run(&out, &["--deadline", "5"], Some("sleep=3@init:0"));
    let err = stderr(&o);
    // On a loaded machine case 0 itself can pass the deadline: killed, `timeout`, exit 3.
    assert!(
        o.status.success() || (o.status.code() == Some(3) && err.contains("1 timeout")),
        "{err}"
    );
    assert!(
        err.contains("2 case(s) not run: they would likely end past --deadline"),
        "{err}"
    );
    assert!(err.contains("[1/3]"), "a progress line per case: {err}");
    let cases = by_case(&rows(&out)).into_keys().collect::<Vec<_>>();
    assert_eq!(cases, vec![0]);
    let o = run(&out, &["--quiet", "--resume"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    complete_once(&out);
}

#[test]
fn a_bad_fault_switch_or_limit_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&dir.path().join("a"), &["--case-timeout", "0"], None);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("case-timeout"), "{}", stderr(&o));
    let o = run(&dir.path().join("b"), &["--deadline", "-1"], None);
    assert!(stderr(&o).contains("deadline"), "{}", stderr(&o));
    // The child refuses a malformed switch: every case's first phase says why.
    let o = run(&dir.path().join("c"), &["--quiet"], Some("boom@init"));
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let all = rows(&dir.path().join("c"));
    assert_eq!(all.len(), 3 * PHASES);
    assert!(
        all[0].error.as_deref().unwrap().contains("MEMFIT_FAULT"),
        "{:?}",
        all[0].error
    );
}
