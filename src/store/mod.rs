//! Where rows go. The JSONL journal is written first and flushed after every case, so a crash
//! loses nothing that finished; CSV and HDF5 are derived from the journal's rows.

pub mod breakdown;
pub mod csv;
pub mod hdf5;
pub mod jsonl;
pub mod picture;
pub mod reference;
pub mod timeline;

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::error::UserError;
use crate::record::Row;

/// Every file under `p` that `keep` accepts (`p` itself when it is a file), searched to any
/// depth, sorted by path; unreadable folders skipped.
pub fn files_under(p: &Path, keep: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![p.to_path_buf()];
    while let Some(q) = todo.pop() {
        if q.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&q) {
                todo.extend(entries.flatten().map(|e| e.path()));
            }
        } else if keep(&q) {
            out.push(q);
        }
    }
    out.sort();
    out
}

/// The result files under `p`: itself when it is a file, else every `results.jsonl` (else
/// `results.h5`) in it and in the folders below, in name order. A path that does not exist is
/// an error naming it.
pub fn result_files(p: &Path) -> Result<Vec<PathBuf>, UserError> {
    if !p.exists() {
        return Err(UserError::Unreadable {
            origin: p.display().to_string(),
            what: "results",
            message: "no such file or folder".into(),
        });
    }
    let mut out = Vec::new();
    collect_result_files(p, &mut out)?;
    Ok(out)
}

fn collect_result_files(p: &Path, out: &mut Vec<PathBuf>) -> Result<(), UserError> {
    let unreadable = |e: std::io::Error| UserError::Unreadable {
        origin: p.display().to_string(),
        what: "results",
        message: e.to_string(),
    };
    if p.is_file() {
        out.push(p.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
        .map_err(unreadable)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let jsonl = p.join("results.jsonl");
    let h5 = p.join("results.h5");
    if jsonl.is_file() {
        out.push(jsonl);
    } else if h5.is_file() {
        out.push(h5);
    }
    for e in entries.iter().filter(|e| e.is_dir()) {
        collect_result_files(e, out)?;
    }
    Ok(())
}

/// The rows of one result file and its run's metadata: an HDF5 file carries it, a JSONL
/// journal has it beside it in `meta.json` (`None` when that file is absent).
pub fn read_rows_and_meta(
    path: &Path,
) -> anyhow::Result<(Vec<Row>, Option<crate::record::RunMeta>)> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("h5") | Some("hdf5") => {
            let (meta, rows) = hdf5::read(path)?;
            Ok((rows, Some(meta)))
        }
        _ => Ok((jsonl::read(path)?, meta_beside(path)?)),
    }
}

/// The run's `meta.json` in the folder of `path`, if there is one.
pub fn meta_beside(path: &Path) -> anyhow::Result<Option<crate::record::RunMeta>> {
    let m = path.with_file_name("meta.json");
    if !m.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&m).with_context(|| format!("reading {}", m.display()))?;
    Ok(Some(serde_json::from_str(&text).with_context(|| {
        format!("{}: not a run's meta.json", m.display())
    })?))
}

/// The rows of one result file: an HDF5 file (`.h5`, `.hdf5`) or a JSONL journal.
pub fn read_rows(path: &Path) -> anyhow::Result<Vec<Row>> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("h5") | Some("hdf5") => Ok(hdf5::read(path)?.1),
        _ => jsonl::read(path),
    }
}

/// A name for a temporary sibling of `path`: `.<name>.<pid>.<nanos>.tmp` in the same directory.
fn temp_path(path: &Path) -> anyhow::Result<PathBuf> {
    let name = path
        .file_name()
        .with_context(|| format!("{} does not name a file", path.display()))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp_name = format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        nanos
    );
    Ok(path.with_file_name(tmp_name))
}

/// Syncs the directory holding `path`, so that a newly created or renamed entry survives a
/// crash. Best effort: platforms that cannot open a directory for syncing are left alone.
pub(crate) fn sync_parent_dir(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Replaces `path` atomically: `fill` writes the content under a temporary name in the same
/// directory, which is then synced and renamed into place, so `path` never holds a partly
/// written file. On failure the temporary file is removed.
pub(crate) fn replace_atomically(
    path: &Path,
    fill: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let tmp = temp_path(path)?;
    let result = fill(&tmp).and_then(|()| {
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing temporary file {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        sync_parent_dir(path);
        Ok(())
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
