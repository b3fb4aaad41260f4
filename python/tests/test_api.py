"""Every call of the Python API, on a small index."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import lsmsearch
from conftest import DIM, SCHEMA, small_rows


def ids(table: pa.Table) -> list[int]:
    return table.column("id").to_pylist()


def test_create_open_and_read_only(uri):
    with lsmsearch.create(uri, schema=SCHEMA, memtable_max_rows=1000) as idx:
        assert idx.schema["primary_key"] == "id"
        assert idx.schema["vector"] == {"column": "emb", "dim": DIM, "metric": "l2"}
        assert idx.arrow_schema.field("emb").type == pa.list_(pa.float32(), DIM)
        idx.add(small_rows(10))
    with lsmsearch.open(uri, settings={"memtable_max_rows": 1000}) as idx:
        assert idx.scan().num_rows == 10
        ro = lsmsearch.open_read_only(uri)
        assert ro.scan().num_rows == 10
        idx.add(small_rows(5, start=100))
        assert ro.scan().num_rows == 10
        ro.refresh()
        assert ro.scan().num_rows == 15
        ro.close()


def test_create_from_a_pyarrow_schema(tmp_path):
    schema = pa.schema(
        [
            ("key", pa.string()),
            ("body", pa.string()),
            ("vec", pa.list_(pa.float32(), 4)),
            ("score", pa.float64()),
            ("when", pa.timestamp("ms")),
        ]
    )
    idx = lsmsearch.create(
        str(tmp_path / "a"), schema, key="key", text=["body"], vector="vec", metric="cosine"
    )
    assert idx.schema["vector"] == {"column": "vec", "dim": 4, "metric": "cosine"}
    assert [p["type"] for p in idx.schema["payload"]] == ["float64", "timestamp_ms"]
    idx.add([{"key": "a", "body": "hello world", "vec": [1, 0, 0, 0], "score": 1.5}])
    assert idx.search("hello").to_list()[0]["key"] == "a"
    idx.close()
    with pytest.raises(lsmsearch.InvalidError, match="key="):
        lsmsearch.create(str(tmp_path / "b"), schema)
    with pytest.raises(lsmsearch.InvalidError, match="'nope'"):
        lsmsearch.create(str(tmp_path / "c"), schema, key="nope")


class CStream:
    """A producer known only by ``__arrow_c_stream__``, as polars and DuckDB results are."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __arrow_c_stream__(self, requested_schema=None):
        return self.table.__arrow_c_stream__(requested_schema)


def test_add_takes_every_kind_of_input(index):
    schema = index.arrow_schema
    table = pa.Table.from_pylist(small_rows(10, 0), schema=schema)
    index.add(table)
    index.add(pa.Table.from_pylist(small_rows(10, 10), schema=schema).to_batches()[0])
    reader = pa.RecordBatchReader.from_batches(
        schema, pa.Table.from_pylist(small_rows(10, 20), schema=schema).to_batches()
    )
    index.add(reader)
    index.add(small_rows(10, 30))
    index.add(pd.DataFrame(small_rows(10, 40)))
    index.add(pl.DataFrame(small_rows(10, 50)))
    index.add(CStream(pa.Table.from_pylist(small_rows(10, 60), schema=schema)))
    receipt = index.add(small_rows(10, 70), durability="buffered")
    assert receipt.rows == 10
    assert sorted(ids(index.scan())) == list(range(80))


def test_arrow_that_fits_crosses_untouched(index):
    from lsmsearch import _conform

    table = pa.Table.from_pylist(small_rows(2000), schema=index.arrow_schema)
    before = pa.total_allocated_bytes()
    assert _conform(table, index.arrow_schema) is table
    index.add(table)
    # Exporting the stream allocates a few structures, never a copy of the columns.
    grown = pa.total_allocated_bytes() - before
    assert grown < table.nbytes / 20, (grown, table.nbytes)


def test_delete_flush_compact_and_stats(index):
    index.add(small_rows(10))
    index.flush()
    index.add(small_rows(10, 10))
    index.flush()
    r = index.delete([3, 4])
    assert r.rows == 2
    assert 3 not in ids(index.scan())
    stats = index.stats()
    assert len(stats["generations"]) == 2, json.dumps(stats)
    assert stats["memtable_rows"] == 2
    report = index.compact()
    assert report is not None and len(index.stats()["generations"]) == 1
    assert sorted(ids(index.scan())) == [i for i in range(20) if i not in (3, 4)]


def test_search_builder(index):
    index.add(small_rows(40))
    index.flush()
    index.add(small_rows(10, 40))
    q = index.search("shock wave")
    full = q.limit(50).to_arrow()
    assert full.column_names[:2] == ["id", "_score"]
    scores = full.column("_score").to_pylist()
    assert scores == sorted(scores, reverse=True)
    assert index.search("shock wave").count() == full.num_rows
    assert index.search("shock wave").where("year >= 1995").count() == sum(
        1 for r in full.to_pylist() if r["year"] >= 1995
    )
    page = index.search("shock wave").limit(5).offset(5).to_list()
    assert [r["id"] for r in page] == ids(full)[5:10]
    sel = index.search("shock").select(["year"]).limit(3).to_arrow()
    assert sel.column_names == ["id", "_score", "year"]
    hi = index.search("shock").highlight(["title"], pre_tag="[", post_tag="]").to_list()
    assert all("[shock]" in r["_highlight_title"] for r in hi if "shock" in r["title"])
    ex = index.search("shock").explain().limit(2).to_list()
    assert abs(json.loads(ex[0]["_explanation"])["value"] - ex[0]["_score"]) < 1e-5
    fourth = full.column("_score")[3].as_py()
    top = index.search("shock wave").min_score(fourth).limit(50).to_arrow()
    assert ids(top) == ids(full)[: top.num_rows] and top.num_rows >= 4
    assert min(top.column("_score").to_pylist()) >= fourth
    v = np.array(small_rows(40)[7]["emb"], dtype=np.float32)
    near = index.search(v).exact().limit(3).to_list()
    assert near[0]["id"] == 7 and near[0]["_distance"] < 1e-6
    assert index.search(list(v)).max_distance(1e-3).exact().to_arrow().num_rows == 1
    hyb = index.search("shock", v).limit(5).to_arrow()
    assert {"_score", "_fts_score", "_distance", "_fts_rank", "_vector_rank"} <= set(hyb.column_names)
    weighted = index.search("shock", v).fusion("weighted", text=0.3, vector=0.7).candidates(20)
    assert weighted.to_arrow().num_rows == 10
    df = index.search("wave").to_pandas()
    assert isinstance(df, pd.DataFrame) and len(df) == 10
    pdf = index.search("wave").to_polars()
    assert isinstance(pdf, pl.DataFrame) and pdf.height == 10
    assert index.search("zzzznothing").to_arrow().num_rows == 0


def test_scan_sql_and_snapshot_pages(index):
    index.add(small_rows(30))
    assert index.scan(where="year = 1991").num_rows == 3
    facets = index.sql(
        "SELECT year, count(*) AS n FROM fts('docs', 'shock', 100) GROUP BY year ORDER BY year"
    )
    assert facets.column_names == ["year", "n"]
    assert sum(facets.column("n").to_pylist()) == index.search("shock").count()
    assert index.sql("SELECT id FROM t WHERE year > 3000", table="t").num_rows == 0
    snap = index.snapshot()
    first = snap.search("study").limit(10).to_arrow()
    index.add([dict(r, title="study study study") for r in small_rows(10, 100)])
    index.delete([ids(first)[0]])
    second = snap.search("study").limit(10).offset(10).to_arrow()
    whole = snap.search("study").limit(20).to_arrow()
    assert ids(first) + ids(second) == ids(whole)
    assert snap.scan().num_rows == 30


def test_async_calls(index):
    async def go():
        await index.add_async(small_rows(10))
        await index.flush_async()
        t = await index.search("shock").to_arrow_async()
        rows = await index.search("wave").to_list_async()
        s = await index.scan_async()
        q = await index.sql_async("SELECT count(*) AS n FROM docs")
        return t, rows, s, q

    t, rows, s, q = asyncio.run(go())
    assert t.num_rows > 0 and rows and s.num_rows == 10
    assert q.column("n").to_pylist() == [10]


def test_read_only_handles_refuse_writes(uri, index):
    index.add(small_rows(3))
    ro = lsmsearch.open_read_only(uri)
    with pytest.raises(lsmsearch.InvalidError, match="read-only"):
        ro._handle.add(pa.table({"id": [1]}), "durable")
    with pytest.raises(lsmsearch.InvalidError, match="read-only handles"):
        index._handle.refresh()
    assert not hasattr(ro, "add") and not hasattr(index, "refresh")
    ro.close()


def test_a_query_is_refined_without_changing_it(index):
    index.add(small_rows(40))
    base = index.search("shock")
    few = base.limit(3)
    recent = base.where("year >= 1995")
    assert few.to_arrow().num_rows == 3
    assert base.to_arrow().num_rows == 10
    assert all(r["year"] >= 1995 for r in recent.to_list())
    assert len(few.to_list()) == 3 and any(r["year"] < 1995 for r in base.limit(40).to_list())
    v = small_rows(40)[7]["emb"]
    switched = index.search("shock", v).fusion("weighted", text=1, vector=0).fusion("rrf", k=10)
    assert switched.to_arrow().num_rows == 10



def test_a_star_import_leaves_the_builtins():
    scope: dict = {}
    exec("from lsmsearch import *", scope)
    assert "open" not in scope and "TimeoutError" not in scope
    assert "create" in scope and "InvalidError" in scope


def test_an_add_of_several_batches_is_one_write(index):
    index.add(small_rows(1))
    before = index.stats()["last_seq"]
    pending = index.stats()["wal_objects_pending"]
    table = pa.Table.from_batches(
        [pa.Table.from_pylist(small_rows(10, s), schema=index.arrow_schema).to_batches()[0] for s in (10, 20, 30)]
    )
    assert len(table.to_batches()) == 3
    receipt = index.add(table)
    assert receipt.rows == 30 and receipt.last_seq == before + 30
    # One write-ahead-log object holds all three batches: all of them or none.
    assert index.stats()["wal_objects_pending"] == pending + 1


def test_empty_batches_in_an_add_are_skipped(index):
    schema = index.arrow_schema
    empty = pa.Table.from_pylist([], schema=schema)
    rows = pa.Table.from_pylist(small_rows(5), schema=schema)
    table = pa.concat_tables([empty, rows, empty])
    assert index.add(table).rows == 5
    assert index.add(empty).rows == 0
    assert index.scan().num_rows == 5

