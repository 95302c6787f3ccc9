//! The journal: one JSON object per line, appended and synced after every case.
//!
//! The journal is the primary record of a run. Each [`Journal::append`] writes whole lines,
//! flushes them and calls `sync_data`, so every row that was appended before a crash is on disk
//! afterwards. CSV and HDF5 files are derived from the rows read back with [`read()`].

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::sync_parent_dir;
use crate::record::Row;

/// An open journal file, positioned for appending.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
}

impl Journal {
    /// Opens the journal at `path` for appending, creating it if it does not exist.
    ///
    /// If an earlier process died in the middle of a line, the file does not end with a newline;
    /// one is appended then, so that the torn fragment stays on its own line (where [`read()`]
    /// reports it by line number) and new rows start on a fresh line. Nothing already in the
    /// file is removed.
    pub fn open(path: &Path) -> anyhow::Result<Journal> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening journal {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("reading metadata of journal {}", path.display()))?
            .len();
        if len == 0 {
            // The file may have just been created: make its directory entry durable too.
            sync_parent_dir(path);
        } else {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1))
                .and_then(|_| file.read_exact(&mut last))
                .with_context(|| format!("reading the end of journal {}", path.display()))?;
            if last[0] != b'\n' {
                // Appending mode writes at the end whatever the read position is.
                file.write_all(b"\n")
                    .and_then(|_| file.sync_data())
                    .with_context(|| {
                        format!("terminating last line of journal {}", path.display())
                    })?;
            }
        }
        Ok(Journal {
            file,
            path: path.to_path_buf(),
        })
    }

    /// The path the journal was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `rows`, one JSON object per line, then flushes and syncs the data to disk.
    ///
    /// All lines of one call are written with a single `write_all`, so a crash leaves at most
    /// the last line of that call incomplete.
    pub fn append(&mut self, rows: &[Row]) -> anyhow::Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let bytes = to_bytes(rows)?;
        self.file
            .write_all(&bytes)
            .with_context(|| format!("appending to journal {}", self.path.display()))?;
        self.file
            .flush()
            .with_context(|| format!("flushing journal {}", self.path.display()))?;
        self.file
            .sync_data()
            .with_context(|| format!("syncing journal {}", self.path.display()))?;
        Ok(())
    }
}

/// Serialises `rows` as JSON Lines: one compact JSON object per row, each followed by `\n`.
///
/// Missing figures are written as `null`; the key order is the field order of [`Row`].
pub fn to_bytes(rows: &[Row]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        serde_json::to_writer(&mut out, row).with_context(|| {
            format!(
                "serialising row {} (case {}, phase {}) as JSON",
                i, row.case, row.phase
            )
        })?;
        out.push(b'\n');
    }
    Ok(out)
}

/// Reads every row of the journal at `path`, in file order.
///
/// Blank lines (empty or whitespace only) are skipped. A line cut short — a kill or a full
/// disk in the middle of a write: JSON that ends early — is skipped with a warning on stderr
/// naming the file and line. Any other line that is not a valid [`Row`] fails the whole read,
/// with an error naming the file and the 1-based line number.
pub fn read(path: &Path) -> anyhow::Result<Vec<Row>> {
    let (rows, torn) = read_lenient(path)?;
    for line in torn {
        eprintln!(
            "warning: {}: line {line} is cut short (a write was interrupted); skipped",
            path.display()
        );
    }
    Ok(rows)
}

/// The rows of the journal at `path` and the line numbers of the lines cut short (see
/// [`read()`]).
pub fn read_lenient(path: &Path) -> anyhow::Result<(Vec<Row>, Vec<usize>)> {
    let text =
        std::fs::read(path).with_context(|| format!("reading journal {}", path.display()))?;
    // A cut can fall inside a multi-byte character: that line is torn, not the file unreadable.
    let text = String::from_utf8_lossy(&text);
    let mut rows = Vec::new();
    let mut torn = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Row>(line) {
            Ok(row) => rows.push(row),
            Err(e) if e.is_eof() || line.contains('\u{FFFD}') => torn.push(i + 1),
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "{}: line {}: not a valid row",
                    path.display(),
                    i + 1
                )));
            }
        }
    }
    Ok((rows, torn))
}

/// Replaces the journal at `path` with `kept` (atomically), after appending `superseded` to
/// the file `aside` (synced first, so no row is ever only in memory). Nothing is written when
/// the journal already holds exactly `kept`.
pub fn rewrite(path: &Path, kept: &[Row], aside: &Path, superseded: &[Row]) -> anyhow::Result<()> {
    let (now, torn) = read_lenient(path)?;
    if superseded.is_empty() && torn.is_empty() && now == kept {
        return Ok(());
    }
    if !superseded.is_empty() {
        Journal::open(aside)?.append(superseded)?;
    }
    let bytes = to_bytes(kept)?;
    super::replace_atomically(path, |tmp| {
        std::fs::write(tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))
    })
}
