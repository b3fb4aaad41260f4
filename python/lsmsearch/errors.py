"""The exceptions lsmsearch raises: one class per kind of failure.

Every class derives from :class:`LsmsearchError`; the message names what was wrong. A call
that raises :class:`InvalidError`, :class:`TimeoutError` or :class:`ClosedError` changed
nothing.
"""

import builtins

__all__ = [
    "LsmsearchError",
    "InvalidError",
    "FencedError",
    "DataError",
    "UnavailableError",
    "ClosedError",
    "TimeoutError",
    "InternalError",
    "ForkError",
]


class LsmsearchError(Exception):
    """The base class of every lsmsearch error."""


class InvalidError(LsmsearchError, ValueError):
    """The input was rejected (schema mismatch, wrong vector dimension, NaN, null key,
    unknown column, malformed query, filter or SQL, bad setting). Nothing was changed."""


class FencedError(LsmsearchError):
    """A newer writer opened the index: this handle acknowledges nothing more."""


class DataError(LsmsearchError):
    """A stored object is corrupt or missing (bad checksum, unknown format version, a gap
    in the write-ahead log). The message names the object."""


class UnavailableError(LsmsearchError, OSError):
    """The object store failed (I/O, network, permission). The call may be retried."""


class ClosedError(LsmsearchError):
    """The handle was closed, or belongs to the parent of a ``fork()``."""


class TimeoutError(LsmsearchError, builtins.TimeoutError):
    """A search passed its deadline and was stopped; nothing was changed."""


class InternalError(LsmsearchError):
    """A bug or an unexpected internal state."""


class ForkError(LsmsearchError, RuntimeError):
    """lsmsearch was used before this process was forked: its threads do not survive
    ``fork()``. Start child processes with the spawn or forkserver method, or use lsmsearch
    in the parent only after forking."""

