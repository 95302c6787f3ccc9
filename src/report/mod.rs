//! Human-readable output. Pure functions from rows to text.

pub mod table;
