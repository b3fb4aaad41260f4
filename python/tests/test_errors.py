"""Bad input raises the exception of its kind, names what was wrong and changes nothing."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

import lsmsearch
from conftest import DIM, SCHEMA, small_rows


@pytest.fixture
def filled(index):
    index.add(small_rows(20))
    index.flush()
    index.add(small_rows(5, 20))
    return index


def unchanged(index, before: pa.Table) -> None:
    assert index.scan().sort_by("id").equals(before.sort_by("id"))


@pytest.mark.parametrize(
    "rows, match",
    [
        ([dict(small_rows(1, 99)[0], emb=[0.5] * (DIM + 1))], "dim|dimension|size"),
        ([dict(small_rows(1, 99)[0], emb=[math.nan] * DIM)], "NaN|finite"),
        ([dict(small_rows(1, 99)[0], id=None)], "null"),
        ([dict(small_rows(1, 99)[0], colour="red")], "unknown column"),
        ([dict(small_rows(1, 99)[0], year="nineteen")], "year|int64"),
    ],
    ids=["wrong-dimension", "nan", "null-key", "unknown-column", "wrong-type"],
)
def test_bad_rows(filled, rows, match):
    before = filled.scan()
    good = small_rows(1, 98)
    with pytest.raises(lsmsearch.InvalidError, match=match):
        filled.add(good + rows)
    unchanged(filled, before)


def test_bad_arrow_rows(filled):
    before = filled.scan()
    table = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "title": pa.array([3.5]),
            "emb": pa.array([[1.0] * DIM], pa.list_(pa.float32(), DIM)),
        }
    )
    with pytest.raises(lsmsearch.InvalidError, match="title"):
        filled.add(table)
    wrong_vec = pa.table(
        {"id": pa.array([500], pa.int64()), "emb": pa.array([[1.0] * 3], pa.list_(pa.float32(), 3))}
    )
    with pytest.raises(lsmsearch.InvalidError, match="emb"):
        filled.add(wrong_vec)
    unchanged(filled, before)


def test_bad_queries(filled):
    v = np.zeros(DIM, dtype=np.float32)
    cases = [
        (lambda: filled.search("title:(").to_arrow(), "query"),
        (lambda: filled.search("shock").select(["colour"]).to_arrow(), "colour"),
        (lambda: filled.search("shock").where("colour = 1").to_arrow(), "colour"),
        (lambda: filled.search([1.0, 2.0]).to_arrow(), "dim|dimension"),
        (lambda: filled.search([math.nan] * DIM).to_arrow(), "NaN|finite"),
        (lambda: filled.search("shock").offset(1_000_000).to_arrow(), "offset"),
        (lambda: filled.search("shock").min_score(-1).to_arrow(), "min_score"),
        (lambda: filled.search(v).max_distance(math.nan).to_arrow(), "max_distance"),
        (lambda: filled.search("a", v).fusion("weighted", text=0, vector=0).to_arrow(), "sum to 0"),
        (lambda: filled.search("shock").max_distance(1.0).to_arrow(), "max_distance"),
        (lambda: filled.search("shock").conjunction("xor").to_arrow(), "conjunction"),
        (lambda: filled.search("shock").timeout(0).to_arrow(), "timeout"),
        (lambda: filled.search("shock").limit(0).to_arrow(), "limit"),
        (lambda: filled.sql("SELEC * FROM docs"), "SQL"),
        (lambda: filled.sql("SELECT nope FROM docs"), "nope"),
        (lambda: filled.scan(where="year >"), "year"),
        (lambda: filled.delete(["a-string-key"]), "key"),
        (lambda: filled.search(v).count(), "count"),
    ]
    before = filled.scan()
    for call, match in cases:
        with pytest.raises(lsmsearch.InvalidError, match=match):
            call()
    unchanged(filled, before)


def test_wrong_python_types_are_type_errors(filled):
    with pytest.raises(TypeError):
        filled.search(123)
    with pytest.raises(TypeError):
        filled.add(42)
    with pytest.raises(TypeError):
        filled.add([1, 2, 3])
    with pytest.raises(TypeError):
        filled.search("shock").limit("ten").to_arrow()


def test_bad_settings_and_schema(tmp_path):
    with pytest.raises(lsmsearch.InvalidError, match="memtable_max_rowz"):
        lsmsearch.create(str(tmp_path / "a"), schema=SCHEMA, memtable_max_rowz=5)
    with pytest.raises(lsmsearch.InvalidError, match="schema"):
        lsmsearch.create(str(tmp_path / "b"), schema={"text": ["t"]})
    with pytest.raises(lsmsearch.InvalidError, match="no index"):
        lsmsearch.open(str(tmp_path / "nothing-here"))


def test_error_classes_by_kind(uri, filled):
    assert issubclass(lsmsearch.InvalidError, ValueError)
    assert issubclass(lsmsearch.TimeoutError, TimeoutError)
    second = lsmsearch.open(uri)
    with pytest.raises(lsmsearch.FencedError):
        filled.add(small_rows(1, 200))
    second.add(small_rows(1, 200))
    second.close()
    with pytest.raises(lsmsearch.ClosedError):
        second.add(small_rows(1, 201))
    for cls in (
        lsmsearch.InvalidError,
        lsmsearch.FencedError,
        lsmsearch.DataError,
        lsmsearch.UnavailableError,
        lsmsearch.ClosedError,
        lsmsearch.TimeoutError,
        lsmsearch.InternalError,
    ):
        assert issubclass(cls, lsmsearch.LsmsearchError)


def test_builder_arguments_are_checked(filled):
    v = np.zeros(DIM, dtype=np.float32)
    invalid = [
        (lambda: filled.search("shock").limit(-1), "limit"),
        (lambda: filled.search("shock").offset(-1), "offset"),
        (lambda: filled.search(v).ef(-1), "ef"),
        (lambda: filled.search("a", v).candidates(-5), "candidates"),
        (lambda: filled.search("shock").highlight(max_chars=-1), "max_chars"),
        (lambda: filled.search("shock").limit(2**70), "limit"),
        (lambda: filled.search("shock").exact().to_arrow(), "exact"),
        (lambda: filled.search("shock").ef(10).to_arrow(), "ef"),
        (lambda: filled.search("shock").fusion("rrf").to_arrow(), "fusion"),
        (lambda: filled.search(v).conjunction("and").to_arrow(), "conjunction"),
        (lambda: filled.search(v).highlight().to_arrow(), "highlight"),
        (lambda: filled.search("a", v).explain().to_arrow(), "explain"),
    ]
    for call, match in invalid:
        with pytest.raises(lsmsearch.InvalidError, match=match):
            call()
    with pytest.raises(TypeError):
        filled.search("shock").limit(2.5)
    # A single column name is one column, not a list of letters.
    one = filled.search("shock").highlight("title").limit(1).to_arrow()
    assert "_highlight_title" in one.column_names
    assert "_highlight_t" not in one.column_names


def test_a_dict_schema_takes_no_column_arguments(tmp_path):
    with pytest.raises(lsmsearch.InvalidError, match="metric"):
        lsmsearch.create(str(tmp_path / "a"), schema=SCHEMA, metric="cosine")
    schema = pa.schema([("k", pa.string()), ("body", pa.string())])
    idx = lsmsearch.create(str(tmp_path / "b"), schema, key="k", text="body")
    assert idx.schema["text"] == ["body"]
    idx.close()


def test_delete_keys_are_ints_or_strs(filled):
    before = filled.scan()
    for keys in ([True], b"\x05\x06", [1.0], [None]):
        with pytest.raises(TypeError):
            filled.delete(keys)
    unchanged(filled, before)
    assert filled.delete(np.int64(4)).rows == 1
    assert filled.delete(np.array([5, 6])).rows == 2
    assert not {4, 5, 6} & set(filled.scan().column("id").to_pylist())


def test_a_corrupt_object_is_a_data_error(uri, index):
    import pathlib

    index.add(small_rows(5))
    index.flush()
    index.close()
    (gen,) = pathlib.Path(uri, "generations").glob("*.gen")
    data = bytearray(gen.read_bytes())
    data[len(data) // 2] ^= 0xFF
    gen.write_bytes(bytes(data))
    with pytest.raises(lsmsearch.DataError, match="gen"):
        ro = lsmsearch.open_read_only(uri)
        ro.scan()
        ro.search("shock").select(["title", "text", "author", "year", "emb"]).limit(5).to_arrow()


def test_numpy_counts_defaults_and_fusion_arguments(filled):
    v = np.zeros(DIM, dtype=np.float32)
    assert filled.search("shock").limit(np.int64(3)).offset(np.int32(1)).to_arrow().num_rows == 3
    # Options at their defaults change nothing, whatever the kind of search.
    assert filled.search(v).explain(False).conjunction("or").to_arrow().num_rows == 10
    assert filled.search("shock").exact(False).to_arrow().num_rows >= 1
    with pytest.raises(lsmsearch.InvalidError, match="weighted"):
        filled.search("a", v).fusion("rrf", text=0.7)
    with pytest.raises(lsmsearch.InvalidError, match="rank constant"):
        filled.search("a", v).fusion("weighted", k=10)

