//! CSV export: one line per [`Row`], columns in field order, a header of field names.
//!
//! A missing figure (`None`) is an empty cell; `status` is its lowercase name (`ok`, `oom`,
//! `error`, `timeout`). Numbers are written in Rust's shortest round-trip form.

use std::fs;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::replace_atomically;
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
    replace_atomically(path, |tmp| {
        fs::write(tmp, &bytes).with_context(|| format!("writing temporary file {}", tmp.display()))
    })
    .with_context(|| format!("writing CSV file {}", path.display()))
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
