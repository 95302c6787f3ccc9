//! Errors the user can fix: bad workload files and flags, missing or unreadable input files.
//! Everything else is `anyhow` with context naming the file or phase.

/// A mistake in a workload file, in flags or in an input path. `origin` is the file path or
/// `flags`.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// `what` names the kind of input: "workload file", "results", …
    #[error("{origin}: cannot read the {what}: {message}")]
    Unreadable {
        origin: String,
        what: &'static str,
        message: String,
    },
    #[error("{origin}: {message}")]
    Syntax { origin: String, message: String },
    #[error("{origin}: key `{key}` = {value} is out of range: {reason}; allowed: {allowed}")]
    OutOfRange {
        origin: String,
        key: String,
        value: String,
        reason: String,
        allowed: String,
    },
    /// A key of an input file that memfit neither reads nor knows to be harmless.
    /// (`key` holds the key and its value: `name` = value.)
    #[error("{origin}: key {key} is not read: {reason}; allowed: {allowed}")]
    UnknownKey {
        origin: String,
        key: String,
        reason: String,
        allowed: String,
    },
    #[error("{origin}: key `{key}` is missing and no preset provides it; allowed: {allowed}")]
    Missing {
        origin: String,
        key: String,
        allowed: String,
    },
    #[error("{path}: {message}")]
    Output { path: String, message: String },
    #[error("calibration {origin}: {message}")]
    Calibration { origin: String, message: String },
}
