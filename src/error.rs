//! The public error type.
//!
//! Every fallible call returns [`Error`], whose [`ErrorKind`] tells the caller what to do about it:
//! fix the input ([`ErrorKind::Invalid`]), stop writing because a newer writer took over
//! ([`ErrorKind::Fenced`]), investigate a corrupt object ([`ErrorKind::Data`]), retry later
//! ([`ErrorKind::Unavailable`]). The message names the object, column, row or value that was wrong.

use std::fmt;
use std::sync::Arc;

/// What kind of failure an [`Error`] is. Callers branch on this, not on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller's input was rejected (schema mismatch, bad vector, null key, malformed query or
    /// filter, bad setting). Nothing was changed.
    Invalid,
    /// A newer writer claimed the index; this handle acknowledges nothing more.
    Fenced,
    /// A persisted object is corrupt or missing (bad CRC, bad magic, unknown format version,
    /// a gap in the WAL). The message names the object.
    Data,
    /// The object store failed (I/O error, network, permission). The operation may be retried.
    Unavailable,
    /// The handle was closed.
    Closed,
    /// A bug or an unexpected internal state.
    Internal,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::Invalid => "invalid input",
            ErrorKind::Fenced => "fenced",
            ErrorKind::Data => "data corruption",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Closed => "closed",
            ErrorKind::Internal => "internal error",
        };
        f.write_str(s)
    }
}

/// The error returned by every fallible lsmsearch call.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    msg: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with a message.
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        Error {
            kind,
            msg: msg.into(),
            source: None,
        }
    }

    /// Attach an underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind prefix.
    pub fn message(&self) -> &str {
        &self.msg
    }

    /// An `Invalid` error: the caller's input was rejected.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, msg)
    }

    pub(crate) fn data(object: impl fmt::Display, msg: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Data, format!("object '{object}': {msg}"))
    }

    pub(crate) fn fenced(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Fenced, msg)
    }

    pub(crate) fn internal(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, msg)
    }

    pub(crate) fn closed() -> Self {
        Self::new(ErrorKind::Closed, "the index handle is closed")
    }

    /// An object-store failure while touching `object`.
    pub(crate) fn store(object: impl fmt::Display, e: object_store::Error) -> Self {
        let kind = match &e {
            object_store::Error::NotFound { .. } => ErrorKind::Data,
            _ => ErrorKind::Unavailable,
        };
        Self::new(kind, format!("object '{object}': {e}")).with_source(e)
    }

    /// Prefix the message with some context.
    pub fn context(mut self, ctx: impl fmt::Display) -> Self {
        self.msg = format!("{ctx}: {}", self.msg);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.msg)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error {{ kind: {:?}, msg: {:?}", self.kind, self.msg)?;
        if let Some(s) = &self.source {
            write!(f, ", source: {s:?}")?;
        }
        write!(f, " }}")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl From<arrow::error::ArrowError> for Error {
    fn from(e: arrow::error::ArrowError) -> Self {
        Error::internal(format!("arrow: {e}")).with_source(e)
    }
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        Error::internal(format!("datafusion: {e}")).with_source(e)
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::internal(format!("background task failed: {e}")).with_source(e)
    }
}
