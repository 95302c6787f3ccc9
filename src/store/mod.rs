//! Where rows go. The JSONL journal is written first and flushed after every case, so a crash
//! loses nothing that finished; CSV and HDF5 are derived from the journal's rows.

pub mod csv;
pub mod hdf5;
pub mod jsonl;
