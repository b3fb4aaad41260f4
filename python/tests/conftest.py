"""Shared fixtures: a small index of the Cranfield collection's schema, and the collection."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import lsmsearch

CRANFIELD = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "cranfield"
DIM = 8

SCHEMA = {
    "primary_key": "id",
    "primary_key_type": "int64",
    "text": ["title", "text"],
    "vector": {"column": "emb", "dim": DIM, "metric": "l2"},
    "payload": [{"name": "author", "type": "utf8"}, {"name": "year", "type": "int64"}],
}


def cranfield_docs() -> list[dict]:
    """The 1,400 Cranfield abstracts, each with a year and a seeded random vector."""
    rng = np.random.default_rng(7)
    docs = []
    with open(CRANFIELD / "docs.jsonl") as f:
        for line in f:
            d = json.loads(line)
            docs.append(
                {
                    "id": int(d["id"]),
                    "title": d.get("title") or "",
                    "text": d.get("text") or "",
                    "author": d.get("author") or "",
                    "year": 1950 + int(d["id"]) % 40,
                    "emb": rng.standard_normal(DIM).astype(np.float32).tolist(),
                }
            )
    return docs


def cranfield_queries() -> list[str]:
    """The 225 queries, query-syntax characters replaced by spaces."""
    out = []
    with open(CRANFIELD / "queries.jsonl") as f:
        for line in f:
            text = json.loads(line)["text"]
            out.append("".join(c if c.isalnum() else " " for c in text))
    return out


@pytest.fixture
def uri(tmp_path: pathlib.Path) -> str:
    return str(tmp_path / "idx")


@pytest.fixture
def index(uri: str):
    with lsmsearch.create(uri, schema=SCHEMA) as idx:
        yield idx


def small_rows(n: int = 20, start: int = 0) -> list[dict]:
    words = ["shock", "wave", "boundary", "layer", "flow", "heat", "wing", "flutter"]
    rng = np.random.default_rng(start)
    return [
        {
            "id": i,
            "title": f"{words[i % 8]} {words[(i * 3) % 8]}",
            "text": f"the {words[(i * 5) % 8]} of a {words[(i + 1) % 8]} study {i}",
            "author": f"author{i % 3}",
            "year": 1990 + i % 10,
            "emb": rng.standard_normal(DIM).astype(np.float32).tolist(),
        }
        for i in range(start, start + n)
    ]
