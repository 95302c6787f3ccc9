//! Where rows go. The JSONL journal is written first and flushed after every case, so a crash
//! loses nothing that finished; CSV and HDF5 are derived from the journal's rows.

pub mod csv;
pub mod hdf5;
pub mod jsonl;

use std::path::{Path, PathBuf};

use anyhow::Context;

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
