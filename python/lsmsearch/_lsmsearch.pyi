"""Type stubs of the native module (see lsmsearch/__init__.py for the public API)."""

from typing import Any, Sequence

import pyarrow as pa

__version__: str

class Handle:
    """An index handle: the writer, a read-only handle, or a point in time of either."""

    @property
    def kind(self) -> str:
        """``"writer"``, ``"read_only"`` or ``"snapshot"``."""
    def schema_json(self) -> str:
        """The schema in its JSON form."""
    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the index's rows."""
    def add(self, data: Any, durability: str = "durable") -> tuple[int, int]:
        """Append Arrow rows (``__arrow_c_stream__`` or ``__arrow_c_array__``):
        ``(last_seq, rows)``."""
    def delete(self, keys: Sequence[int | str], durability: str = "durable") -> tuple[int, int]:
        """Delete rows by key: ``(last_seq, rows)``."""
    def search(
        self,
        text: str | None = None,
        vector: Sequence[float] | None = None,
        *,
        k: int = 10,
        offset: int = 0,
        filter: str | None = None,
        columns: Sequence[str] | None = None,
        conjunction: str = "or",
        min_score: float | None = None,
        max_distance: float | None = None,
        highlight: tuple[Sequence[str] | None, int, str, str] | None = None,
        explain: bool = False,
        exact: bool = False,
        ef: int | None = None,
        fusion: str = "rrf",
        rrf_k: float = 60.0,
        weights: tuple[float, float] | None = None,
        candidates: int | None = None,
        timeout: float | None = None,
    ) -> pa.Table:
        """Full-text, vector or hybrid search."""
    def count(
        self,
        text: str,
        *,
        filter: str | None = None,
        conjunction: str = "or",
        min_score: float | None = None,
        timeout: float | None = None,
    ) -> int:
        """The number of live rows matching a full-text query."""
    def scan(self, filter: str | None = None) -> pa.Table:
        """Every live row passing ``filter``."""
    def sql(self, statement: str, table: str = "docs") -> pa.Table:
        """Run SQL with this handle as table ``table``."""
    def point_in_time(self) -> Handle:
        """A point in time of what the handle sees."""
    def flush(self) -> None:
        """Write the memtable as a generation."""
    def compact(self) -> str | None:
        """Merge generations: the report as JSON, or None."""
    def stats(self) -> str:
        """The handle's figures as JSON."""
    def refresh(self) -> None:
        """See what the writer made durable (read-only handles)."""
    def close(self) -> None:
        """Close the handle."""

def create(uri: str, schema: str, settings: str | None = None) -> Handle:
    """Create an index: schema and settings as JSON."""

def open(uri: str, settings: str | None = None) -> Handle:  # noqa: A001
    """Open an index as its writer."""

def open_read_only(uri: str, settings: str | None = None) -> Handle:
    """Open an index read-only."""
