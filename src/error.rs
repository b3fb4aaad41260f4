//! Errors: the public [`Error`] with its [`ErrorKind`], and the internal [`Reason`] the code
//! branches on.
//!
//! Every fallible call returns [`Error`], whose [`ErrorKind`] tells the caller what to do about it:
//! fix the input ([`ErrorKind::Invalid`]), stop writing because a newer writer took over
//! ([`ErrorKind::Fenced`]), investigate a corrupt object ([`ErrorKind::Data`]), retry later
//! ([`ErrorKind::Unavailable`]). The message names the object, column, row or value that was wrong.
//!
//! Inside the crate an error is built from a [`Reason`], and code that must tell failures apart
//! (an object that is gone, a conditional create that lost) matches on the reason, never on the
//! message text. `From<Reason> for Error` is the one place that decides the public kind.

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
    /// A query passed its deadline (see [`crate::SearchOptions::timeout`]) and was stopped;
    /// nothing was changed. The message says which query and how long it was given.
    Timeout,
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
            ErrorKind::Timeout => "timed out",
            ErrorKind::Internal => "internal error",
        };
        f.write_str(s)
    }
}

/// Why an operation failed, as the crate's own code tells failures apart.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Reason {
    /// The caller's input was rejected.
    #[error("{0}")]
    Invalid(String),
    /// An object that should exist does not (or vanished between a LIST and a GET).
    #[error("object '{object}': {detail}")]
    NotFound {
        object: String,
        detail: String,
        #[source]
        source: Option<object_store::Error>,
    },
    /// An object's bytes are wrong: bad magic, bad contents.
    #[error("object '{object}': {detail}")]
    Corrupt { object: String, detail: String },
    /// An object is shorter than it says or fails its CRC: what a torn write leaves.
    #[error("object '{object}': {detail}")]
    Torn { object: String, detail: String },
    /// An object of a format version this build does not read.
    #[error("object '{object}': {what} has format version {found}; this build reads {}", versions(*oldest, *newest))]
    UnsupportedVersion {
        object: String,
        what: &'static str,
        found: u64,
        oldest: u64,
        newest: u64,
    },
    /// A newer writer claimed the index.
    #[error("{0}")]
    Fenced(String),
    /// A conditional create lost: the object exists (a concurrent writer created it).
    #[error("object '{object}': {source}")]
    Conflict {
        object: String,
        #[source]
        source: object_store::Error,
    },
    /// The object store failed while touching `object`.
    #[error("object '{object}': {source}")]
    Store {
        object: String,
        #[source]
        source: object_store::Error,
    },
    /// A local I/O failure outside the object store (creating a directory).
    #[error("{0}")]
    Io(String),
    /// The handle was closed.
    #[error("the index handle is closed")]
    Closed,
    /// A query passed its deadline.
    #[error("{0}")]
    Timeout(String),
    /// A bug or an unexpected internal state.
    #[error("{0}")]
    Internal(String),
    /// A text index (tantivy) failed. Where a persisted index fails to open, the caller makes
    /// it a `Corrupt` error naming the object (see [`Error::corrupt_in`]).
    #[error("tantivy: {0}")]
    Text(#[from] tantivy::TantivyError),
    /// An error an application built with [`Error::new`].
    #[error("{msg}")]
    Other { kind: ErrorKind, msg: String },
}

fn versions(oldest: u64, newest: u64) -> String {
    if oldest == newest {
        format!("version {newest}")
    } else {
        format!("versions {oldest} to {newest}")
    }
}

/// The error returned by every fallible lsmsearch call.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    msg: String,
    reason: Arc<Reason>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Reason> for Error {
    /// The one mapping from internal reasons to public kinds.
    fn from(reason: Reason) -> Self {
        let kind = match &reason {
            Reason::Invalid(_) => ErrorKind::Invalid,
            Reason::NotFound { .. } => ErrorKind::Data,
            Reason::Corrupt { .. } => ErrorKind::Data,
            Reason::Torn { .. } => ErrorKind::Data,
            Reason::UnsupportedVersion { .. } => ErrorKind::Data,
            Reason::Fenced(_) => ErrorKind::Fenced,
            // Another writer raced this one; with fresh state a retry may succeed.
            Reason::Conflict { .. } => ErrorKind::Unavailable,
            Reason::Store { .. } => ErrorKind::Unavailable,
            Reason::Io(_) => ErrorKind::Unavailable,
            Reason::Closed => ErrorKind::Closed,
            Reason::Timeout(_) => ErrorKind::Timeout,
            Reason::Internal(_) => ErrorKind::Internal,
            Reason::Text(_) => ErrorKind::Internal,
            Reason::Other { kind, .. } => *kind,
        };
        Error {
            kind,
            msg: reason.to_string(),
            reason: Arc::new(reason),
            source: None,
        }
    }
}

impl Error {
    /// A new error of `kind` with a message.
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        Reason::Other {
            kind,
            msg: msg.into(),
        }
        .into()
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

    /// Prefix the message with some context.
    pub fn context(mut self, ctx: impl fmt::Display) -> Self {
        self.msg = format!("{ctx}: {}", self.msg);
        self
    }

    /// A `Timeout` error: a query passed its deadline.
    pub(crate) fn timeout(msg: impl Into<String>) -> Self {
        Reason::Timeout(msg.into()).into()
    }

    /// An `Invalid` error: the caller's input was rejected.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Reason::Invalid(msg.into()).into()
    }

    /// Whether an object this operation needed does not exist (anymore).
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(*self.reason, Reason::NotFound { .. })
    }

    pub(crate) fn data(object: impl fmt::Display, detail: impl fmt::Display) -> Self {
        Reason::Corrupt {
            object: object.to_string(),
            detail: detail.to_string(),
        }
        .into()
    }

    /// This error, met while reading `what` of the persisted `object`, as that object's
    /// corruption: a `Data` error naming the object and what of it failed, with this error as
    /// its source.
    pub(crate) fn corrupt_in(self, object: impl fmt::Display, what: &str) -> Self {
        let msg = format!("{what}: {}", self.msg);
        Error::data(object, msg).with_source(self)
    }

    /// A torn object: short, or failing its CRC.
    pub(crate) fn torn(object: impl fmt::Display, detail: impl fmt::Display) -> Self {
        Reason::Torn {
            object: object.to_string(),
            detail: detail.to_string(),
        }
        .into()
    }

    /// Whether an object is torn (short or failing its CRC), as an interrupted write leaves it.
    pub(crate) fn is_torn(&self) -> bool {
        matches!(*self.reason, Reason::Torn { .. })
    }

    pub(crate) fn not_found(object: impl fmt::Display, detail: impl fmt::Display) -> Self {
        Reason::NotFound {
            object: object.to_string(),
            detail: detail.to_string(),
            source: None,
        }
        .into()
    }

    pub(crate) fn unsupported_version(
        object: impl fmt::Display,
        what: &'static str,
        found: u64,
        oldest: u64,
        newest: u64,
    ) -> Self {
        Reason::UnsupportedVersion {
            object: object.to_string(),
            what,
            found,
            oldest,
            newest,
        }
        .into()
    }

    pub(crate) fn fenced(msg: impl Into<String>) -> Self {
        Reason::Fenced(msg.into()).into()
    }

    pub(crate) fn internal(msg: impl Into<String>) -> Self {
        Reason::Internal(msg.into()).into()
    }

    pub(crate) fn io(msg: impl Into<String>) -> Self {
        Reason::Io(msg.into()).into()
    }

    pub(crate) fn closed() -> Self {
        Reason::Closed.into()
    }

    /// An object-store failure while touching `object`: `NotFound` when the store says the
    /// object does not exist, `Conflict` when a conditional create lost, `Store` otherwise.
    pub(crate) fn store(object: impl fmt::Display, e: object_store::Error) -> Self {
        let object = object.to_string();
        match e {
            object_store::Error::NotFound { .. } => Reason::NotFound {
                detail: e.to_string(),
                object,
                source: Some(e),
            },
            object_store::Error::AlreadyExists { .. } => Reason::Conflict { object, source: e },
            source => Reason::Store { object, source },
        }
        .into()
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
        if let Some(s) = std::error::Error::source(self) {
            write!(f, ", source: {s:?}")?;
        }
        write!(f, " }}")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.source {
            Some(s) => Some(s.as_ref() as &(dyn std::error::Error + 'static)),
            None => std::error::Error::source(self.reason.as_ref()),
        }
    }
}

impl From<arrow::error::ArrowError> for Error {
    fn from(e: arrow::error::ArrowError) -> Self {
        Error::internal(format!("arrow: {e}")).with_source(e)
    }
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        // One of ours that crossed a DataFusion stream comes back as it was.
        if let datafusion::error::DataFusionError::External(inner) = &e {
            if let Some(ours) = inner.downcast_ref::<Error>() {
                return ours.clone();
            }
        }
        Error::internal(format!("datafusion: {e}")).with_source(e)
    }
}

impl From<tantivy::TantivyError> for Error {
    fn from(e: tantivy::TantivyError) -> Self {
        // A read of a generation's cold postings failed under tantivy: the error it carries
        // (a store's, or a block failing its check) keeps its kind and names the object.
        if let tantivy::TantivyError::IoError(io) = &e {
            if let Some(inner) = io.get_ref().and_then(|s| s.downcast_ref::<Error>()) {
                return inner.clone();
            }
        }
        Reason::Text(e).into()
    }
}

impl From<tantivy::directory::error::OpenReadError> for Error {
    fn from(e: tantivy::directory::error::OpenReadError) -> Self {
        Reason::Text(e.into()).into()
    }
}

impl From<tantivy::query::QueryParserError> for Error {
    fn from(e: tantivy::query::QueryParserError) -> Self {
        Reason::Text(e.into()).into()
    }
}

impl From<tokio::task::JoinError> for Error {
    fn from(e: tokio::task::JoinError) -> Self {
        Error::internal(format!("background task failed: {e}")).with_source(e)
    }
}

/// The text a panic carried (its `&str` or `String` payload), empty for any other payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_of_ours_through_a_datafusion_stream_keeps_its_kind() {
        // A search arm's or a scan's error reaches the caller through a DataFusion stream,
        // wrapped as `External`: it must come back as it was, not as an internal error.
        let ours = Error::invalid("a filter failed on row 3");
        let through = datafusion::error::DataFusionError::External(Box::new(ours));
        let back = Error::from(through);
        assert_eq!(back.kind(), ErrorKind::Invalid, "{back}");
        assert_eq!(back.message(), "a filter failed on row 3");
    }

    #[test]
    fn store_errors_keep_their_reason() {
        let nf = Error::store(
            "wal/1.wal",
            object_store::Error::NotFound {
                path: "wal/1.wal".into(),
                source: "gone".into(),
            },
        );
        assert!(nf.is_not_found());
        assert_eq!(nf.kind(), ErrorKind::Data);
        assert!(nf.message().starts_with("object 'wal/1.wal'"));
        let inner = std::error::Error::source(&nf).expect("the store's error is the source");
        assert!(inner.downcast_ref::<object_store::Error>().is_some());
        let v = Error::unsupported_version("m", "manifest", 9, 1, 1);
        assert_eq!(v.kind(), ErrorKind::Data);
        assert!(v.message().contains("version 9"), "{v}");
        assert!(matches!(
            *v.reason,
            Reason::UnsupportedVersion { found: 9, .. }
        ));
    }
}
