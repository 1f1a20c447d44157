//! Errors of space construction and searcher state.

use thiserror::Error;

/// A search space that cannot be built. `path` names the field (dotted for
/// nested configs, e.g. `model.width`).
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{path}: {message}")]
pub struct SpaceError {
    /// Dotted path of the offending field.
    pub path: String,
    /// What rule it breaks.
    pub message: String,
}

impl SpaceError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self { path: path.into(), message: message.into() }
    }
}

/// Errors of searchers.
#[derive(Debug, Error)]
pub enum SearchError {
    /// The space or a given point is invalid.
    #[error(transparent)]
    Space(#[from] SpaceError),
    /// Saved searcher state could not be restored.
    #[error("cannot restore searcher state: {0}")]
    State(String),
}
