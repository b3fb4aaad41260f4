"""Results equal independent references over the live rows, whatever the split into
generations: one tantivy-py index (full text), numpy brute force (vectors), and the fusion
of both as the documentation states it (hybrid)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tantivy

import lsmsearch
from conftest import SCHEMA, cranfield_docs, cranfield_queries


@pytest.fixture(scope="module")
def cranfield(tmp_path_factory):
    """Cranfield in five generations and a memtable, with updates and deletes across them;
    the index and its live rows by key."""
    docs = cranfield_docs()
    idx = lsmsearch.create(str(tmp_path_factory.mktemp("cran") / "idx"), schema=SCHEMA)
    live: dict[int, dict] = {}
    for start in range(0, len(docs), 280):
        chunk = docs[start : start + 280]
        idx.add(chunk)
        live.update((d["id"], d) for d in chunk)
        # Update some rows of earlier generations, delete others.
        updated = [
            dict(d, title=d["title"] + " revised flow", year=d["year"] + 1)
            for d in docs[: start + 1 : 13]
        ]
        if updated:
            idx.add(updated)
            live.update((d["id"], d) for d in updated)
        gone = [d["id"] for d in docs[5 : start + 1 : 17]]
        if gone:
            idx.delete(gone)
            for k in gone:
                live.pop(k, None)
        if start + 280 < len(docs):
            idx.flush()
    assert len(idx.stats()["generations"]) == 4
    yield idx, live
    idx.close()


def tantivy_reference(live: dict[int, dict]):
    b = tantivy.SchemaBuilder()
    b.add_integer_field("id", stored=True, indexed=True)
    b.add_text_field("title", stored=False, tokenizer_name="default")
    b.add_text_field("text", stored=False, tokenizer_name="default")
    index = tantivy.Index(b.build())
    w = index.writer(50_000_000, 1)
    for d in live.values():
        w.add_document(tantivy.Document(id=d["id"], title=d["title"], text=d["text"]))
    w.commit()
    index.reload()
    return index


def reference_search(index, query: str) -> list[tuple[int, float]]:
    """Every match, by score descending then key."""
    searcher = index.searcher()
    q = index.parse_query(query, ["title", "text"])
    hits = searcher.search(q, max(searcher.num_docs, 1)).hits
    out = [(searcher.doc(a)["id"][0], s) for s, a in hits]
    return sorted(out, key=lambda r: (-r[1], r[0]))


def test_full_text_equals_one_tantivy_index(cranfield):
    idx, live = cranfield
    ref = tantivy_reference(live)
    queries = cranfield_queries()
    for q in queries:
        want = reference_search(ref, q)[:10]
        got = idx.search(q).select([]).limit(10).to_list()
        assert [r["id"] for r in got] == [k for k, _ in want], q
        for r, (_, s) in zip(got, want):
            assert math.isclose(r["_score"], s, rel_tol=1e-5), q
    assert idx.search(queries[0]).count() == len(reference_search(ref, queries[0]))


def brute_force(live: dict[int, dict], v: np.ndarray) -> list[tuple[int, float]]:
    keys = np.array(sorted(live))
    embs = np.array([live[k]["emb"] for k in keys], dtype=np.float64)
    d = np.sqrt(((embs - v.astype(np.float64)) ** 2).sum(axis=1))
    order = np.lexsort((keys, d))
    return [(int(keys[i]), float(d[i])) for i in order]


def test_exact_vector_search_equals_brute_force(cranfield):
    idx, live = cranfield
    rng = np.random.default_rng(3)
    for _ in range(30):
        v = rng.standard_normal(SCHEMA["vector"]["dim"]).astype(np.float32)
        want = brute_force(live, v)[:10]
        got = idx.search(v).exact().select([]).limit(10).to_list()
        assert [r["id"] for r in got] == [k for k, _ in want]
        for r, (_, d) in zip(got, want):
            assert math.isclose(r["_distance"], d, rel_tol=1e-4)


def reference_fusion(texts, nearest, fusion, candidates, k):
    """The documented fusion of each part's best ``candidates``: RRF ``Σ 1/(k + rank)``, or
    the weighted sum of BM25 / best BM25 and (d_max - d) / (d_max - d_min)."""
    t, n = texts[:candidates], nearest[:candidates]
    fused: dict[int, float] = {}
    best = max((s for _, s in t), default=0.0)
    near, far = (n[0][1], n[-1][1]) if n else (0.0, 0.0)
    for i, (key, score) in enumerate(t):
        add = 1 / (fusion[1] + i + 1) if fusion[0] == "rrf" else fusion[1] * score / best
        fused[key] = fused.get(key, 0.0) + add
    for i, (key, d) in enumerate(n):
        if fusion[0] == "rrf":
            add = 1 / (fusion[1] + i + 1)
        else:
            add = fusion[2] * ((far - d) / (far - near) if far > near else 1.0)
        fused[key] = fused.get(key, 0.0) + add
    return sorted(fused.items(), key=lambda r: (-np.float32(r[1]), r[0]))[:k]


@pytest.mark.parametrize("fusion", [("rrf", 60.0), ("weighted", 0.3, 0.7)], ids=["rrf", "weighted"])
def test_hybrid_equals_the_reference_fusion(cranfield, fusion):
    idx, live = cranfield
    ref = tantivy_reference(live)
    rng = np.random.default_rng(5)
    for q in cranfield_queries()[:40]:
        v = rng.standard_normal(SCHEMA["vector"]["dim"]).astype(np.float32)
        want = reference_fusion(reference_search(ref, q), brute_force(live, v), fusion, 50, 10)
        query = idx.search(q, v).exact().candidates(50).select([]).limit(10)
        if fusion[0] == "rrf":
            query = query.fusion("rrf", k=fusion[1])
        else:
            query = query.fusion("weighted", text=fusion[1], vector=fusion[2])
        got = query.to_list()
        assert [r["id"] for r in got] == [k for k, _ in want], q
        for r, (_, s) in zip(got, want):
            assert math.isclose(r["_score"], s, rel_tol=1e-4), q
