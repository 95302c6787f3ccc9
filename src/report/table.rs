//! The run table: one line per case × phase with measured and predicted peak, error and times.

use crate::record::{Row, Status};
use crate::step::Phase;
use crate::units::human_bytes;

/// Signed error of the prediction in percent of the measured value.
pub fn error_pct(measured: u64, predicted: u64) -> Option<f64> {
    (measured > 0).then(|| (predicted as f64 - measured as f64) / measured as f64 * 100.0)
}

/// Column titles.
pub fn header() -> String {
    format!(
        "{:>4} {:<10} {:>4} {:>5} {:>5} {:>3} {:>3} {:>6} {:<12} {:<10} {:<6} {:>12} {:>12} {:>8} {:>7} {:>7} {:>7}",
        "case",
        "preset",
        "B",
        "S",
        "H",
        "A",
        "L",
        "V",
        "opt",
        "phase",
        "status",
        "measured",
        "predicted",
        "err %",
        "user s",
        "sys s",
        "wall s"
    )
}

fn opt_f(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

/// One line of the table.
pub fn line(r: &Row) -> String {
    let measured = r.peak_bytes.map_or("-".into(), |b| human_bytes(b as f64));
    let predicted = r
        .predicted_peak_bytes
        .map_or("-".into(), |b| human_bytes(b as f64));
    let err = match (r.peak_bytes, r.predicted_peak_bytes) {
        (Some(m), Some(p)) => opt_f(error_pct(m, p), 3),
        _ => "-".into(),
    };
    if r.phase == Phase::Dataload {
        return dataload_line(r, &measured);
    }
    let mut s = format!(
        "{:>4} {:<10} {:>4} {:>5} {:>5} {:>3} {:>3} {:>6} {:<12} {:<10} {:<6} {:>12} {:>12} {:>8} {:>7} {:>7} {:>7}",
        r.case,
        r.preset,
        r.batch,
        r.seq,
        r.hidden,
        r.heads,
        r.layers,
        r.vocab,
        r.optimizer,
        r.phase,
        r.status.as_str(),
        measured,
        predicted,
        err,
        opt_f(r.cpu_user_s, 3),
        opt_f(r.cpu_sys_s, 3),
        opt_f(r.wall_s, 3),
    );
    if let (true, Some(e)) = (r.status != Status::Ok, &r.error) {
        s.push_str(&format!("\n     {e}"));
    }
    s
}

/// Column titles of the `dataload` rows ([`dataload_line`]): the pipeline where a model row has
/// its sizes, the throughput, the process tree's PSS peak where a prediction would be.
pub fn dataload_header() -> String {
    format!(
        "{:>4} {:<10} {:>4} {:<26} {:<12} {:<10} {:<6} {:>12} {:>12} {:>8} {:>7} {:>7} {:>7}",
        "case",
        "dataload",
        "B",
        "storage kind×workers prefetch",
        "rate",
        "phase",
        "status",
        "measured",
        "PSS peak",
        "",
        "user s",
        "sys s",
        "wall s"
    )
}

/// The header a row is printed under: [`header`], or [`dataload_header`] for a `dataload` row.
pub fn header_of(r: &Row) -> String {
    if r.phase == Phase::Dataload {
        dataload_header()
    } else {
        header()
    }
}

/// A `dataload` row has no model: the model columns show the pipeline (storage, workers,
/// prefetch), the throughput, and the process tree's PSS peak where the prediction would be.
fn dataload_line(r: &Row, measured: &str) -> String {
    let n = |v: Option<u64>| v.map_or("-".into(), |x| x.to_string());
    let pipeline = format!(
        "{} {}×{} p{}",
        r.storage,
        r.worker_kind,
        n(r.workers),
        n(r.prefetch)
    );
    let rate = r
        .images_per_s
        .map_or("-".into(), |x| format!("{x:.0} img/s"));
    let pss = r
        .pss_peak_bytes
        .map_or("-".into(), |b| format!("PSS {}", human_bytes(b as f64)));
    let mut s = format!(
        "{:>4} {:<10} {:>4} {:<26} {:<12} {:<10} {:<6} {:>12} {:>12} {:>8} {:>7} {:>7} {:>7}",
        r.case,
        "dataload",
        r.batch,
        pipeline,
        rate,
        r.phase,
        r.status.as_str(),
        measured,
        pss,
        "-",
        opt_f(r.cpu_user_s, 3),
        opt_f(r.cpu_sys_s, 3),
        opt_f(r.wall_s, 3),
    );
    if let (true, Some(e)) = (r.status != Status::Ok, &r.error) {
        s.push_str(&format!("\n     {e}"));
    }
    s
}

/// All lines, each under its kind's header (printed again where the kind changes).
pub fn render(rows: &[Row]) -> String {
    let mut out = String::new();
    let mut shown = None;
    for r in rows {
        let h = header_of(r);
        if shown.as_ref() != Some(&h) {
            out.push_str(&h);
            out.push('\n');
            shown = Some(h);
        }
        out.push_str(&line(r));
        out.push('\n');
    }
    if rows.is_empty() {
        out.push_str(&header());
        out.push('\n');
    }
    out
}
