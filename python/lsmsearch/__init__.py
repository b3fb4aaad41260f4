"""lsmsearch: a real-time search index built as an LSM tree on object storage.

Append rows (a primary key, text, an embedding vector, payload columns) and search them the
moment the call returns: BM25 full-text search with statistics over every live row, vector
nearest-neighbour search, hybrid search fusing both, filters in SQL.

Example (README.md's Python section has a longer one)::

    import lsmsearch

    index = lsmsearch.create("./docs-index", schema={
        "primary_key": "id", "text": ["title", "body"],
        "vector": {"column": "emb", "dim": 3, "metric": "cosine"},
        "payload": [{"name": "year", "type": "int64"}]})
    index.add([{"id": "a", "title": "shock waves", "body": "in a tube",
                "emb": [0.1, 0.2, 0.3], "year": 1990}])
    index.search("shock").limit(5).to_list()

Every call runs in Rust with the GIL released: other Python threads run meanwhile, and
Ctrl-C interrupts a search, scan, SQL statement, refresh or compaction (a compaction publishes its
merge whole or not at all); a write (``add``, ``delete``, ``flush``, ``close``) completes first. A
failure raises a subclass of
:class:`LsmsearchError` (see :mod:`lsmsearch.errors`).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import operator
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import pyarrow as pa

from . import _lsmsearch, errors
from .errors import (
    ClosedError,
    DataError,
    FencedError,
    ForkError,
    InternalError,
    InvalidError,
    LsmsearchError,
    TimeoutError,
    UnavailableError,
)

__version__: str = _lsmsearch.__version__

# `open` and `TimeoutError` stay out of a star import, which would hide the built-ins: use
# `lsmsearch.open` and `lsmsearch.TimeoutError`.
__all__ = [
    "create",
    "open_read_only",
    "Index",
    "ReadOnlyIndex",
    "Snapshot",
    "Query",
    "WriteReceipt",
    *(name for name in errors.__all__ if name != "TimeoutError"),
]


class WriteReceipt(NamedTuple):
    """What an acknowledged write returns."""

    last_seq: int
    """Sequence number of the last row the call wrote."""
    rows: int
    """Rows written (appended rows, or tombstones of a delete)."""


_PAYLOAD_TYPES = {
    pa.string(): "utf8",
    pa.bool_(): "bool",
    pa.int8(): "int8",
    pa.int16(): "int16",
    pa.int32(): "int32",
    pa.int64(): "int64",
    pa.uint8(): "uint8",
    pa.uint16(): "uint16",
    pa.uint32(): "uint32",
    pa.uint64(): "uint64",
    pa.float32(): "float32",
    pa.float64(): "float64",
    pa.timestamp("ms"): "timestamp_ms",
    pa.timestamp("us"): "timestamp_us",
    pa.date32(): "date32",
}

_KEY_TYPES = {pa.string(): "utf8", pa.int64(): "int64", pa.uint64(): "uint64"}


def _schema_json(
    schema: Mapping[str, Any] | pa.Schema,
    key: str | None,
    text: Sequence[str] | None,
    vector: str | None,
    metric: str | None,
) -> str:
    """The JSON form of ``schema``: a dict as the command line takes it, or a
    ``pyarrow.Schema`` with the key, text and vector columns named."""
    if isinstance(schema, Mapping):
        if key is not None or text is not None or vector is not None or metric is not None:
            raise InvalidError(
                "key, text, vector and metric describe a pyarrow.Schema; a schema dict holds them itself"
            )
        return json.dumps(schema)
    if not isinstance(schema, pa.Schema):
        raise TypeError(
            f"schema is a {type(schema).__name__}: pass a dict or a pyarrow.Schema"
        )
    if key is None:
        raise InvalidError("a pyarrow.Schema needs key=, the name of the primary-key column")
    text = _names(text)
    fields = {f.name: f for f in schema}
    for name in [key, *text] + ([vector] if vector else []):
        if name not in fields:
            raise InvalidError(f"column {name!r} is not in the schema")
    out: dict[str, Any] = {"primary_key": key, "text": text, "payload": []}
    key_type = _KEY_TYPES.get(fields[key].type)
    if key_type is None:
        raise InvalidError(
            f"the key column {key!r} is {fields[key].type}: it is string, int64 or uint64"
        )
    out["primary_key_type"] = key_type
    for name in text:
        if fields[name].type != pa.string():
            raise InvalidError(f"text column {name!r} is {fields[name].type}: it is string")
    if vector:
        t = fields[vector].type
        if not (pa.types.is_fixed_size_list(t) and t.value_type == pa.float32()):
            raise InvalidError(
                f"vector column {vector!r} is {t}: it is a fixed_size_list of float32"
            )
        out["vector"] = {"column": vector, "dim": t.list_size, "metric": metric or "l2"}
    for f in schema:
        if f.name in (key, vector) or f.name in text:
            continue
        kind = _PAYLOAD_TYPES.get(f.type)
        if kind is None:
            raise InvalidError(
                f"payload column {f.name!r} is {f.type}, which an index does not store"
            )
        out["payload"].append({"name": f.name, "type": kind})
    return json.dumps(out)


def _names(names: str | Sequence[str] | None) -> list[str]:
    """Column names: one name or a sequence of them."""
    if names is None:
        return []
    if isinstance(names, str):
        return [names]
    return list(names)


def _count(name: str, value: Any, least: int = 0) -> int:
    """An int argument, at least ``least`` and within 64 bits."""
    if isinstance(value, bool):
        raise TypeError(f"{name} is a bool: it is an int")
    try:
        value = operator.index(value)  # an int, or numpy's
    except TypeError:
        raise TypeError(f"{name} is a {type(value).__name__}: it is an int") from None
    if not least <= value < 2**63:
        raise InvalidError(f"{name} is {value}: it is at least {least} and below 2**63")
    return value


def _settings_json(settings: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> str | None:
    merged = dict(settings or {})
    merged.update(kwargs)
    return json.dumps(merged) if merged else None


def create(
    uri: str,
    schema: Mapping[str, Any] | pa.Schema,
    *,
    key: str | None = None,
    text: Sequence[str] | None = None,
    vector: str | None = None,
    metric: str | None = None,
    settings: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Index:
    """Create an index at ``uri`` (a directory, ``file://``, or ``s3://bucket/prefix``).

    ``schema`` is the JSON-like dict the command line takes (``{"primary_key": "id",
    "text": [...], "vector": {"column", "dim", "metric"}, "payload": [{"name", "type"}]}``)
    or a ``pyarrow.Schema`` with ``key``, ``text`` and ``vector`` naming its columns (the
    vector a ``fixed_size_list<float32>``, distances by ``metric``: ``l2``, ``cosine`` or
    ``dot``, default ``l2``; every other column a payload column). Settings are keyword arguments or a
    dict (``memtable_max_rows=50_000``, ``cache_bytes=...``); unknown names are an error.
    """
    handle = _lsmsearch.create(
        uri, _schema_json(schema, key, text, vector, metric), _settings_json(settings, kwargs)
    )
    return Index(handle)


def open(uri: str, *, settings: Mapping[str, Any] | None = None, **kwargs: Any) -> Index:  # noqa: A001
    """Open the index at ``uri`` as its writer (a newer writer fences an older one)."""
    return Index(_lsmsearch.open(uri, _settings_json(settings, kwargs)))


def open_read_only(
    uri: str, *, settings: Mapping[str, Any] | None = None, **kwargs: Any
) -> ReadOnlyIndex:
    """Open the index at ``uri`` read-only: it sees what the writer made durable, as of
    :meth:`ReadOnlyIndex.refresh`."""
    return ReadOnlyIndex(_lsmsearch.open_read_only(uri, _settings_json(settings, kwargs)))


async def _in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a blocking call in the event loop's default executor: it releases the GIL, so the
    loop and other threads keep running."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))


def _vector(v: Any) -> list[float]:
    try:
        import numpy as np

        arr = np.asarray(v, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise InvalidError(f"the query vector is not a sequence of numbers: {e}") from None
    if arr.ndim != 1:
        raise InvalidError(f"the query vector has shape {arr.shape}: it is one-dimensional")
    return arr.tolist()


def _is_vector(v: Any) -> bool:
    if isinstance(v, (str, bytes)):
        return False
    return hasattr(v, "__array__") or isinstance(v, (list, tuple))


# Options each kind of search refuses: it would have no use for them.
_NOT_TEXT = ("max_distance", "exact", "ef", "fusion", "rrf_k", "weights", "candidates")
_NOT_VECTOR = ("min_score", "highlight", "explain", "conjunction", "fusion", "rrf_k", "weights", "candidates")
_NOT_HYBRID = ("min_score", "max_distance", "highlight", "explain")
# An option set to its default changes nothing, whatever the kind of search.
_UNSET = object()
_DEFAULTS = {"explain": False, "exact": False, "conjunction": "or"}


class Query:
    """A search, built step by step and run by ``to_arrow()`` and its siblings.

    Each method returns a new query and leaves the one it was called on as it was, so a
    base query can be refined in several ways.

    Full text (``index.search("text")``), vector (``index.search(vector)``) or hybrid
    (``index.search("text", vector)``: both parts fused, by reciprocal rank fusion unless
    :meth:`fusion` says otherwise). Results come ordered by ``_score`` (descending) or
    ``_distance`` (ascending), then key.
    """

    def __init__(self, handle: Any, text: str | None, vector: Any | None) -> None:
        if text is not None and not isinstance(text, str):
            raise TypeError(f"the text query is a {type(text).__name__}: it is a str")
        self._handle = handle
        self._text = text
        self._vector = None if vector is None else _vector(vector)
        self._opts: dict[str, Any] = {}

    def _set(self, **kw: Any) -> Query:
        q = copy.copy(self)
        q._opts = {**self._opts, **kw}
        return q

    def where(self, predicate: str) -> Query:
        """Keep rows passing a SQL predicate over payload columns (``"year >= 2020"``),
        applied inside every part before its top k."""
        return self._set(filter=predicate)

    def select(self, columns: Sequence[str]) -> Query:
        """Return these user columns after the key and the score (the vector too, when
        named). Default: every user column but the vector."""
        return self._set(columns=_names(columns))

    def limit(self, k: int) -> Query:
        """Return at most ``k`` rows (default 10)."""
        return self._set(k=_count("limit", k, 1))

    def offset(self, n: int) -> Query:
        """Skip the first ``n`` rows: the rows ranked ``n..n + k``. Pages of one
        :class:`Snapshot` agree with one larger search."""
        return self._set(offset=_count("offset", n))

    def highlight(
        self,
        columns: Sequence[str] | None = None,
        *,
        max_chars: int = 150,
        pre_tag: str = "<b>",
        post_tag: str = "</b>",
    ) -> Query:
        """Add ``_highlight_<column>``: a snippet of each matched text column (default:
        every text column) with the matched terms between ``pre_tag`` and ``post_tag``."""
        cols = None if columns is None else _names(columns)
        max_chars = _count("max_chars", max_chars, 1)
        return self._set(highlight=(cols, max_chars, pre_tag, post_tag))

    def min_score(self, score: float) -> Query:
        """Full text: return only rows scoring at least ``score``."""
        return self._set(min_score=score)

    def max_distance(self, distance: float) -> Query:
        """Vector: return only rows within ``distance`` of the query vector."""
        return self._set(max_distance=distance)

    def explain(self, on: bool = True) -> Query:
        """Full text: add ``_explanation``, each row's score explained (JSON)."""
        return self._set(explain=on)

    def conjunction(self, op: str) -> Query:
        """``"or"`` (default: any term may match) or ``"and"`` (every term must)."""
        return self._set(conjunction=op)

    def exact(self, on: bool = True) -> Query:
        """Vector: compare with every live row instead of walking the graphs."""
        return self._set(exact=on)

    def ef(self, ef: int) -> Query:
        """Vector: the graph search's candidate list size."""
        return self._set(ef=_count("ef", ef, 1))

    def fusion(self, kind: str = "rrf", *, k: float = 60.0, text: float | None = None,
               vector: float | None = None) -> Query:
        """Hybrid: ``"rrf"`` (reciprocal rank fusion, rank constant ``k``) or
        ``"weighted"`` (``text`` × BM25 / best BM25 + ``vector`` × normalised closeness)."""
        if kind == "weighted" and k != 60.0:
            raise InvalidError("k is the rank constant of fusion(\"rrf\"), not of the weighted fusion")
        if kind != "weighted" and (text is not None or vector is not None):
            raise InvalidError("text and vector weigh fusion(\"weighted\"), not reciprocal rank fusion")
        q = self._set()
        for key in ("fusion", "weights", "rrf_k"):
            q._opts.pop(key, None)
        if kind == "weighted":
            weights = (0.5 if text is None else text, 0.5 if vector is None else vector)
            return q._set(fusion=kind, weights=weights)
        return q._set(fusion=kind, rrf_k=k)

    def candidates(self, n: int) -> Query:
        """Hybrid: rows each part ranks before fusing (default 100)."""
        return self._set(candidates=_count("candidates", n, 1))

    def timeout(self, seconds: float) -> Query:
        """Fail with :class:`TimeoutError` past this many seconds."""
        return self._set(timeout=seconds)

    def _check_kind(self) -> None:
        """Refuse an option this kind of search would ignore."""
        if self._text is not None and self._vector is not None:
            kind, refused = "a hybrid", _NOT_HYBRID
        elif self._text is not None:
            kind, refused = "a full-text", _NOT_TEXT
        else:
            kind, refused = "a vector", _NOT_VECTOR
        for name in refused:
            if name in self._opts and self._opts[name] != _DEFAULTS.get(name, _UNSET):
                name = {"rrf_k": "fusion", "weights": "fusion"}.get(name, name)
                raise InvalidError(f"{name} does not apply to {kind} search")

    def to_arrow(self) -> pa.Table:
        """Run the search: a ``pyarrow.Table``."""
        self._check_kind()
        return self._handle.search(self._text, self._vector, **self._opts)

    def to_list(self) -> list[dict[str, Any]]:
        """Run the search: one dict per row."""
        return self.to_arrow().to_pylist()

    def to_pandas(self) -> Any:
        """Run the search: a ``pandas.DataFrame``."""
        return self.to_arrow().to_pandas()

    def to_polars(self) -> Any:
        """Run the search: a ``polars.DataFrame``."""
        import polars

        return polars.from_arrow(self.to_arrow())

    def count(self) -> int:
        """Full text: the exact number of live rows matching the query, its filter and its
        ``min_score`` (``limit`` and ``offset`` play no part)."""
        if self._text is None or self._vector is not None:
            raise InvalidError("count is for full-text searches")
        keep = ("filter", "conjunction", "min_score", "timeout")
        return self._handle.count(self._text, **{k: v for k, v in self._opts.items() if k in keep})

    async def to_arrow_async(self) -> pa.Table:
        """:meth:`to_arrow` without blocking the event loop."""
        return await _in_thread(self.to_arrow)

    async def to_list_async(self) -> list[dict[str, Any]]:
        """:meth:`to_list` without blocking the event loop."""
        return await _in_thread(self.to_list)


class Snapshot:
    """A point in time of an index: searches of it see the same rows, whatever is written
    after, so consecutive pages agree with one larger search."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def search(self, query: Any = None, vector: Any = None) -> Query:
        """A search of this point in time (see :meth:`Index.search`)."""
        return _search(self._handle, query, vector)

    def scan(self, where: str | None = None) -> pa.Table:
        """Every live row passing ``where`` (SQL), as a ``pyarrow.Table``."""
        return self._handle.scan(where)

    def snapshot(self) -> Snapshot:
        """This point in time."""
        return self


def _search(handle: Any, query: Any, vector: Any) -> Query:
    if vector is not None:
        return Query(handle, query, vector)
    if query is None:
        raise InvalidError("a search needs a text query, a vector, or both")
    if isinstance(query, str):
        return Query(handle, query, None)
    if _is_vector(query):
        return Query(handle, None, query)
    raise TypeError(
        f"search takes a str (full text), a vector (list or numpy array) or both, not a {type(query).__name__}"
    )


class _Handle:
    """What the writer and read-only handles share."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self._arrow_schema: pa.Schema = handle.arrow_schema()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def schema(self) -> dict[str, Any]:
        """The index schema, in its JSON-like form."""
        return json.loads(self._handle.schema_json())

    @property
    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the index's rows."""
        return self._arrow_schema

    def search(self, query: Any = None, vector: Any = None) -> Query:
        """A search: ``search("text")`` (full text), ``search(vector)`` (nearest
        neighbours; a list or numpy array) or ``search("text", vector)`` (hybrid). Refine it
        with :class:`Query`'s methods, run it with ``to_arrow()`` and its siblings."""
        return _search(self._handle, query, vector)

    def scan(self, where: str | None = None) -> pa.Table:
        """Every live row passing ``where`` (SQL over the columns), as a ``pyarrow.Table``."""
        return self._handle.scan(where)

    def sql(self, statement: str, *, table: str = "docs") -> pa.Table:
        """Run SQL with this index as table ``table``, and the table functions
        ``fts(table, query, k)``, ``knn(table, [vector], k)`` and
        ``hybrid(table, query, [vector], k)``."""
        return self._handle.sql(statement, table)

    def snapshot(self) -> Snapshot:
        """A point in time of what this handle sees (consistent pages)."""
        return Snapshot(self._handle.point_in_time())

    def stats(self) -> dict[str, Any]:
        """Generations, memtable and write-ahead-log figures, as a dict."""
        return json.loads(self._handle.stats())

    def close(self) -> None:
        """Close the handle (the writer first writes what it buffered)."""
        self._handle.close()

    async def scan_async(self, where: str | None = None) -> pa.Table:
        """:meth:`scan` without blocking the event loop."""
        return await _in_thread(self.scan, where)

    async def sql_async(self, statement: str, *, table: str = "docs") -> pa.Table:
        """:meth:`sql` without blocking the event loop."""
        return await _in_thread(self.sql, statement, table=table)


def _rows(data: Any, schema: pa.Schema) -> Any:
    """``data`` as Arrow the native module takes: Arrow objects (anything with
    ``__arrow_c_stream__`` or ``__arrow_c_array__``) pass as they are unless a column's type
    differs from the index's (then that column is cast); a list of dicts or a pandas
    DataFrame is converted."""
    if isinstance(data, Mapping):
        data = [data]
    if isinstance(data, list):
        if not all(isinstance(r, Mapping) for r in data):
            raise TypeError("add takes a list of dicts, not a list of other things")
        names = set(schema.names)
        unknown = sorted({k for r in data for k in r} - names)
        if unknown:
            raise InvalidError(f"unknown column(s) {unknown}: the index has {schema.names}")
        try:
            return pa.Table.from_pylist(data, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            raise InvalidError(f"the rows do not fit the index schema: {e}") from None
    if type(data).__module__.startswith("pandas"):
        try:
            data = pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as e:
            raise InvalidError(f"the DataFrame does not convert to Arrow: {e}") from None
    if not (hasattr(data, "__arrow_c_stream__") or hasattr(data, "__arrow_c_array__")):
        raise TypeError(
            f"add takes Arrow data, a pandas DataFrame or a list of dicts, not a {type(data).__name__}"
        )
    return _conform(data, schema)


def _conform(data: Any, schema: pa.Schema) -> Any:
    """Cast the columns of ``data`` whose type is not the index's; data that already fits
    is returned untouched (its buffers cross to Rust without a copy)."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        given = data.schema
    elif isinstance(data, pa.RecordBatchReader):
        return data if _fits(data.schema, schema) else _conform(data.read_all(), schema)
    else:
        data = pa.table(data)
        given = data.schema
    if _fits(given, schema):
        return data
    columns = []
    for field in given:
        col = data.column(field.name)
        if field.name in schema.names and schema.field(field.name).type != field.type:
            target = schema.field(field.name).type
            if _family(field.type) != _family(target):
                raise InvalidError(
                    f"column {field.name!r} is {field.type}: the index stores it as {target}"
                )
            try:
                col = col.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise InvalidError(
                    f"column {field.name!r} is {field.type}, which does not convert to {target}: {e}"
                ) from None
        columns.append(col)
    return type(data).from_arrays(columns, names=given.names)


# pyarrow before 16 has no string views.
_is_string_view = getattr(pa.types, "is_string_view", lambda t: False)


def _family(t: pa.DataType) -> str:
    """The kind of values a type holds: a cast within a kind keeps their meaning."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or _is_string_view(t):
        return "text"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "time"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return "vector" if _family(t.value_type) == "number" else str(t)
    return str(t)


def _fits(given: pa.Schema, schema: pa.Schema) -> bool:
    return all(
        f.name not in schema.names or schema.field(f.name).type == f.type for f in given
    )


def _keys(keys: Any) -> list[int | str]:
    """Keys to delete: one key or an iterable of them, each an int (numpy's too) or a str."""
    import numpy as np

    if isinstance(keys, (str, int, np.integer)):
        keys = [keys]
    elif isinstance(keys, (bytes, bytearray)) or not isinstance(keys, Iterable):
        raise TypeError(f"delete takes keys (int or str) or a list of them, not a {type(keys).__name__}")
    out: list[int | str] = []
    for k in keys:
        if isinstance(k, bool) or not isinstance(k, (str, int, np.integer)):
            raise TypeError(f"a key to delete is a {type(k).__name__}: it is an int or a str")
        out.append(k if isinstance(k, str) else int(k))
    return out


class Index(_Handle):
    """The writer of an index: appends, deletes, flushes and compactions, and searches that
    see every acknowledged write at once. Use it from any number of threads."""

    def add(self, data: Any, durability: str = "durable") -> WriteReceipt:
        """Append rows: a ``pyarrow.Table``, ``RecordBatch`` or ``RecordBatchReader``, any
        object with ``__arrow_c_stream__`` (polars, DuckDB), a pandas DataFrame, or a list
        of dicts. A row whose key exists replaces it. The rows are one write: all of them
        or none, checked first (schema, vector dimension, NaN, null keys). Several batches
        are concatenated (a copy; one batch crosses without one). Rows of any size are one
        write-ahead-log object: to stream a large input, add it a batch at a time.

        ``durability="durable"`` returns once the rows are in the write-ahead log on the
        store; ``"buffered"`` once they are searchable (written within milliseconds)."""
        rows = _rows(data, self._arrow_schema)
        return WriteReceipt(*self._handle.add(rows, durability))

    def delete(self, keys: Iterable[Any], durability: str = "durable") -> WriteReceipt:
        """Delete the rows with these keys (str or int, as the key column)."""
        return WriteReceipt(*self._handle.delete(_keys(keys), durability))

    def flush(self) -> None:
        """Write the memtable as a generation now."""
        self._handle.flush()

    def compact(self) -> dict[str, Any] | None:
        """Merge generations now; the report as a dict, or None when nothing merged."""
        report = self._handle.compact()
        return None if report is None else json.loads(report)

    async def add_async(self, data: Any, durability: str = "durable") -> WriteReceipt:
        """:meth:`add` without blocking the event loop."""
        return await _in_thread(self.add, data, durability)

    async def delete_async(self, keys: Iterable[Any], durability: str = "durable") -> WriteReceipt:
        """:meth:`delete` without blocking the event loop."""
        return await _in_thread(self.delete, keys, durability)

    async def flush_async(self) -> None:
        """:meth:`flush` without blocking the event loop."""
        await _in_thread(self.flush)

    async def compact_async(self) -> dict[str, Any] | None:
        """:meth:`compact` without blocking the event loop."""
        return await _in_thread(self.compact)


class ReadOnlyIndex(_Handle):
    """A read-only handle: searches what the writer made durable, as of the last
    :meth:`refresh`. Any number of them, in any processes."""

    def refresh(self) -> None:
        """See what the writer made durable since the handle opened or last refreshed."""
        self._handle.refresh()

    async def refresh_async(self) -> None:
        """:meth:`refresh` without blocking the event loop."""
        await _in_thread(self.refresh)
