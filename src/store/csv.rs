//! CSV export: one line per [`Row`], columns in field order, a header of field names.
//!
//! A missing figure (`None`) is an empty cell; `status` is its lowercase name (`ok`, `oom`,
//! `error`, `timeout`). Numbers are written in Rust's shortest round-trip form.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use crate::record::Row;

/// The names of [`Row`]'s fields in declaration order, which is the CSV column order.
///
/// Taken from the struct's serde description (not from a hand-kept list), so it cannot drift
/// from `record.rs`.
pub fn columns() -> &'static [&'static str] {
    struct Capture(Option<&'static [&'static str]>);

    impl<'de> Deserializer<'de> for &mut Capture {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("only the struct description is wanted"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = Some(fields);
            Err(de::Error::custom("field names captured"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut capture = Capture(None);
    // The deserializer always fails on purpose; only the captured field list matters.
    let _ = Row::deserialize(&mut capture);
    capture
        .0
        .expect("Row derives Deserialize as a struct, so its field names are always captured")
}

/// Serialises `rows` as CSV: a header line of [`columns`], then one line per row.
///
/// The header is written even when `rows` is empty. `None` becomes an empty cell.
pub fn to_bytes(rows: &[Row]) -> anyhow::Result<Vec<u8>> {
    let mut writer = ::csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    writer
        .write_record(columns())
        .context("writing the CSV header")?;
    for (i, row) in rows.iter().enumerate() {
        writer.serialize(row).with_context(|| {
            format!(
                "serialising row {} (case {}, phase {}) as CSV",
                i, row.case, row.phase
            )
        })?;
    }
    writer
        .into_inner()
        .map_err(|e| anyhow::anyhow!("finishing the CSV output: {}", e.error()))
}

/// Writes `rows` as CSV to `path`, replacing any file there.
///
/// The bytes go to a temporary file in the same directory, which is synced and then renamed
/// into place, so `path` never holds a partly written file.
pub fn write(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let bytes = to_bytes(rows)?;
    let tmp = temp_path(path)?;
    let result = (|| -> anyhow::Result<()> {
        let mut file = File::create(&tmp)
            .with_context(|| format!("creating temporary file {}", tmp.display()))?;
        file.write_all(&bytes)
            .and_then(|_| file.sync_all())
            .with_context(|| format!("writing temporary file {}", tmp.display()))?;
        drop(file);
        fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        sync_parent_dir(path);
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.with_context(|| format!("writing CSV file {}", path.display()))
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
fn sync_parent_dir(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_follow_row_fields() {
        let cols = columns();
        assert_eq!(cols[0], "run_id");
        assert!(cols.contains(&"status"));
        assert_eq!(cols[cols.len() - 1], "threads");
    }
}
