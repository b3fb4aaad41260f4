#!/usr/bin/env python3
"""Query latency of lsmsearch and peer systems on the same corpus, on local disk.

For each generation count G the N benchmark documents (`lsmsearch bench corpus`) are
appended in G batches and then queried at once, without rebuilding any index after the
batches:

* lsmsearch: `lsmsearch bench generations` with no added store latency (warm p50).
* LanceDB (`lancedb`): `table.add` x G into a fresh table; full-text indexes built once,
  after the first batch; no vector index (flat kNN).
* Lance MemWAL (`lance.mem_wal`): the first batch is the base table (IVF-PQ and inverted
  indexes), the other G-1 batches go through a ShardWriter, each sealed into its own
  flushed generation; vector kNN through LsmVectorSearchPlanner, full text through
  LanceDB's MemWAL reader (`use_lsm`) over the same dataset.

Prints one table of p50 latencies and writes OUT/peers.json. See README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback
import uuid
import warnings
from pathlib import Path

# Lance logs deprecation notices per query; keep errors only. LanceDB's reader also logs
# "Index __lance_mem_wal has no fields" at error level on every MemWAL query (the MemWAL
# system index has no columns): silence that target. Failures still raise exceptions.
os.environ.setdefault("LANCE_LOG", "error")
os.environ.setdefault("LANCEDB_LOG", "error,lance::index=off")
warnings.filterwarnings("ignore")

ROOT = Path(__file__).resolve().parent.parent.parent
K = 10
DIM = 128
PK_META = {"lance-schema:unenforced-primary-key": "true"}
# The tokenizer of lsmsearch's text columns (tantivy's `default`): split on
# non-alphanumeric characters, drop tokens over 40 bytes, lowercase; no stemming, no stop
# words, no ASCII folding. The peers' inverted indexes are configured the same way.
TOKENIZER = dict(
    base_tokenizer="simple",
    lower_case=True,
    stem=False,
    remove_stop_words=False,
    ascii_folding=False,
    max_token_length=40,
)
COLUMNS = ["id", "year", "bucket"]  # what lsmsearch returns: key, payload (and the score)

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


class Step:
    """Prints a step's start and its duration to stderr."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        log(f"{self.what} ...")
        self.t = time.monotonic()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.seconds = time.monotonic() - self.t
        state = "failed" if exc_type else "done"
        log(f"{self.what}: {state} in {self.seconds:.1f}s")
        return False


def pct(sorted_ms: list[float], p: float) -> float | None:
    """Nearest-rank percentile, as lsmsearch's benchmark computes it."""
    if not sorted_ms:
        return None
    return sorted_ms[round((len(sorted_ms) - 1) * p)]


def short_error(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}".strip()
    # Drop the Rust source locations that Lance appends.
    s = re.sub(r",\s*/home/\S+\.rs:\d+:\d+", "", s)
    return s if len(s) <= 600 else s[:600] + " ..."


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Measure lsmsearch and peer systems (LanceDB, Lance MemWAL) on the same "
        "corpus: append N documents in G batches, then query at once. Relative paths are "
        "taken from the repository root.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--docs", type=int, default=100_000, help="documents per index")
    p.add_argument("--gens", default="1,2,5,10,18,32,64", help="generation counts G")
    p.add_argument(
        "--queries",
        type=int,
        default=100,
        help="queries measured per system, G and kind (after a warm-up pass over the same "
        "queries); the Cranfield queries are cycled, as lsmsearch's benchmark does",
    )
    p.add_argument("--lsmsearch", default="target/release/lsmsearch", help="lsmsearch binary")
    p.add_argument("--out", default="bench-out/peers", help="output directory")
    p.add_argument("--data", default="tests/data/cranfield", help="the Cranfield collection")
    p.add_argument(
        "--max-seconds-per-series",
        type=float,
        default=60.0,
        help="time guard for one series (one system, one G, one query kind): the warm-up "
        "stops after a third of it and the measurement when it is used up, so p50 is then "
        "over fewer queries (marked in the table)",
    )
    p.add_argument(
        "--systems",
        default="lsmsearch,lancedb,memwal",
        help="systems to run, comma-separated",
    )
    p.add_argument(
        "--memwal-nprobes",
        type=int,
        default=20,
        help="IVF partitions probed per source by MemWAL's vector planner (its default is 20; "
        "more raises recall and latency)",
    )
    p.add_argument("--keep", action="store_true", help="keep the peers' tables after measuring")
    a = p.parse_args()
    a.gens = sorted({int(g) for g in a.gens.split(",") if g.strip()})
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    unknown = set(a.systems) - {"lsmsearch", "lancedb", "memwal"}
    if unknown:
        p.error(f"unknown systems: {', '.join(sorted(unknown))}")
    if a.docs < 1 or a.queries < 1 or not a.gens or min(a.gens) < 1:
        p.error("--docs, --queries and every G must be positive")
    return a


def resolve(path: str) -> Path:
    p = Path(path)
    return Path(os.path.normpath(p if p.is_absolute() else ROOT / p))


# ---------------------------------------------------------------------------------------
# Query series
# ---------------------------------------------------------------------------------------


def run_series(
    run, items: list, queries: int, budget: float, exact=None, late_from: int | None = None
) -> dict:
    """Warm up over the sample, then time each query of it.

    `run(item)` executes one query and returns the result keys: for recall against
    `exact[item]` when given, and for the share of hits with a key >= `late_from` (rows
    of the batches after the first) when given.
    """
    sample = [items[i % len(items)] for i in range(queries)]
    start = time.monotonic()
    warm = 0
    for it in sample:
        run(it)
        warm += 1
        if time.monotonic() - start > budget / 3:
            break
    ms, recalls, hits, late = [], [], 0, 0
    for it in sample:
        t = time.perf_counter()
        keys = run(it)
        ms.append((time.perf_counter() - t) * 1e3)
        hits += len(keys)
        if late_from is not None:
            late += sum(1 for k in keys if k >= late_from)
        if exact is not None:
            recalls.append(len(set(keys) & exact[it]) / K)
        if time.monotonic() - start > budget:
            break
    ms.sort()
    out = {
        "p50_ms": pct(ms, 0.5),
        "p95_ms": pct(ms, 0.95),
        "p99_ms": pct(ms, 0.99),
        "samples": len(ms),
        "warmup_queries": warm,
        "time_guard_hit": len(ms) < queries,
        "warmup_cut_short": warm < queries,
        "mean_hits": hits / len(ms) if ms else 0,
    }
    if exact is not None:
        out["recall_at_10"] = sum(recalls) / len(recalls) if recalls else None
    if late_from is not None:
        out["hits_from_later_batches"] = late / hits if hits else None
    return out


def exact_neighbours(docs_emb, ids, q_emb) -> list[set]:
    """Exact cosine top-K of every query (brute force), as sets of ids."""
    import numpy as np

    d = docs_emb / np.maximum(np.linalg.norm(docs_emb, axis=1, keepdims=True), 1e-12)
    out = []
    for start in range(0, len(q_emb), 64):
        q = q_emb[start : start + 64]
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
        sims = q @ d.T
        top = np.argpartition(-sims, min(K, sims.shape[1] - 1), axis=1)[:, :K]
        out.extend(set(ids[row].tolist()) for row in top)
    return out


def bounds(n: int, g: int) -> list[tuple[int, int]]:
    return [(i * n // g, (i + 1) * n // g) for i in range(g)]


# ---------------------------------------------------------------------------------------
# lsmsearch
# ---------------------------------------------------------------------------------------


def lsmsearch_version(binary: Path) -> str:
    try:
        v = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        return v.split()[-1] if v else "unknown"
    except Exception as e:  # noqa: BLE001
        return f"unknown ({short_error(e)})"


def export_corpus(a, binary: Path, out: Path, data: Path, commands: list) -> None:
    cmd = [
        str(binary), "--json", "bench", "corpus",
        "--docs", str(a.docs), "--dim", str(DIM), "--out", str(out), "--data", str(data),
    ]
    commands.append(shlex.join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def run_lsmsearch(a, binary: Path, out: Path, data: Path, commands: list) -> dict:
    cmd = [
        str(binary), "--json", "bench", "generations",
        "--docs", str(a.docs),
        "--gens", ",".join(map(str, a.gens)),
        "--get-latency-ms", "0",
        "--put-latency-ms", "0",
        "--out", str(out),
        "--data", str(data),
        "--warm-queries", str(a.queries),
        "--cold-queries", "3",
    ]
    commands.append(shlex.join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"lsmsearch bench generations exited with {proc.returncode}")
    lines = [l for l in proc.stdout.splitlines() if l.strip().startswith("{")]
    if not lines:
        raise RuntimeError("lsmsearch bench generations printed no JSON report")
    report = json.loads(lines[-1])
    per_g: dict[int, dict] = {}
    for r in report.get("runs", []):
        if r.get("mode") == "warm" and r.get("query") in ("fts", "vector"):
            per_g.setdefault(int(r["generations"]), {})[r["query"]] = {
                k: r.get(k) for k in ("p50_ms", "p95_ms", "p99_ms", "samples")
            }
    return {"per_g": per_g, "report": report}


# ---------------------------------------------------------------------------------------
# LanceDB
# ---------------------------------------------------------------------------------------


def lancedb_fts_index(table, column: str) -> None:
    from lancedb.index import FTS

    table.create_index(column, config=FTS(**TOKENIZER), name=f"{column}_idx")


def run_lancedb(a, g: int, docs, qtext, qemb, exact, workdir: Path) -> dict:
    import lancedb
    import numpy as np
    from lancedb.query import MultiMatchQuery

    res: dict = {"generations": g, "batches": g}
    shutil.rmtree(workdir, ignore_errors=True)
    db = lancedb.connect(str(workdir))
    table = db.create_table("docs", schema=docs.schema)
    first_end = 0
    t_add = t_index = 0.0
    for i, (lo, hi) in enumerate(bounds(docs.num_rows, g)):
        t = time.monotonic()
        table.add(docs.slice(lo, hi - lo))
        t_add += time.monotonic() - t
        if i == 0:
            first_end = hi
            t = time.monotonic()
            for col in ("title", "text"):
                lancedb_fts_index(table, col)
            t_index = time.monotonic() - t
    res["append_seconds"] = round(t_add, 3)
    res["fts_index_seconds"] = round(t_index, 3)
    stats = table.index_stats("text_idx")
    res["fts_index"] = {
        "columns": ["title", "text"],
        "built_after_batch": 1,
        "num_indexed_rows": stats.num_indexed_rows,
        "num_unindexed_rows": stats.num_unindexed_rows,
    }
    log(
        f"  lancedb G={g}: appended in {t_add:.1f}s, FTS indexes on title+text built after "
        f"batch 1 in {t_index:.1f}s ({stats.num_indexed_rows} rows indexed, "
        f"{stats.num_unindexed_rows} appended later and unindexed)"
    )

    def fts(i):
        r = (
            table.search(MultiMatchQuery(qtext[i], ["title", "text"]), query_type="fts")
            .limit(K)
            .select(COLUMNS)
            .to_arrow()
        )
        return r["id"].to_pylist()

    def vector(i):
        r = (
            table.search(np.asarray(qemb[i], dtype=np.float32), vector_column_name="emb")
            .distance_type("cosine")
            .limit(K)
            .select(COLUMNS)
            .to_arrow()
        )
        return r["id"].to_pylist()

    items = list(range(len(qtext)))
    budget = a.max_seconds_per_series
    with Step(f"  lancedb G={g}: full-text queries"):
        try:
            res["fts"] = run_series(fts, items, a.queries, budget, late_from=first_end)
        except Exception as e:  # noqa: BLE001
            res["fts"] = {"error": short_error(e)}
    with Step(f"  lancedb G={g}: vector queries"):
        try:
            res["vector"] = run_series(vector, items, a.queries, budget, exact, first_end)
        except Exception as e:  # noqa: BLE001
            res["vector"] = {"error": short_error(e)}
    try:
        res["fts_plan"] = (
            table.search(MultiMatchQuery(qtext[0], ["title", "text"]), query_type="fts")
            .limit(K)
            .select(COLUMNS)
            .explain_plan(True)
        )
        res["vector_plan"] = (
            table.search(np.asarray(qemb[0], dtype=np.float32), vector_column_name="emb")
            .distance_type("cosine")
            .limit(K)
            .select(COLUMNS)
            .explain_plan(True)
        )
    except Exception as e:  # noqa: BLE001
        res["plan_error"] = short_error(e)
    return res


# ---------------------------------------------------------------------------------------
# Lance MemWAL
# ---------------------------------------------------------------------------------------


def pk_schema(schema):
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False, metadata=PK_META) if f.name == "id" else f
            for f in schema
        ]
    )


def shard_snapshot(path: Path, shard_id: str):
    """The shard's flushed generations, read from the directory layout.

    `lance.mem_wal` has no call that lists a shard's flushed generations, so the
    ShardSnapshot is built from `_mem_wal/<shard>/<prefix>_gen_<n>` directories.
    """
    from lance.mem_wal import ShardSnapshot

    gens = {}
    shard_dir = path / "_mem_wal" / shard_id
    for d in shard_dir.iterdir() if shard_dir.exists() else []:
        m = re.fullmatch(r".*_gen_(\d+)", d.name)
        if m and d.is_dir():
            gens[int(m.group(1))] = d.name
    snap = ShardSnapshot(shard_id)
    for gen, folder in sorted(gens.items()):
        snap = snap.with_sstable(gen, folder)
    snap = snap.with_current_generation(max(gens, default=0) + 1)
    return snap, gens


def ivf_partitions(rows: int) -> int:
    return max(1, min(256, int(math.sqrt(rows))))


def memwal_base(path: Path, table, vector_index: bool = True, fts_index: bool = True):
    """Write `table` as the base dataset with the indexes MemWAL is to maintain."""
    import lance

    ds = lance.write_dataset(table, str(path), schema=table.schema)
    maintained = []
    if vector_index:
        ds.create_index(
            "emb",
            index_type="IVF_PQ",
            name="emb_idx",
            metric="cosine",
            num_partitions=ivf_partitions(table.num_rows),
            num_sub_vectors=16,
        )
        maintained.append("emb_idx")
    if fts_index:
        ds.create_scalar_index("text", "INVERTED", name="text_idx", **TOKENIZER)
        maintained.append("text_idx")
    ds.initialize_mem_wal(unsharded=True, maintained_indexes=maintained)
    return lance.dataset(str(path)), maintained


def memwal_write(ds, batches, total_rows: int) -> tuple[str, dict, dict]:
    """Put each batch through one ShardWriter; every put seals the memtable."""
    shard_id = str(uuid.uuid4())
    biggest = max((b.nbytes for b in batches), default=0)
    writer = ds.mem_wal_writer(
        shard_id,
        # Seal (freeze and flush to a generation) after every put: one batch per memtable.
        max_memtable_batches=1,
        max_memtable_rows=total_rows + 1,
        max_memtable_size=max(64 << 20, 2 * biggest),
        max_unflushed_memtable_bytes=max(1 << 30, 4 * biggest + (1 << 30)),
    )
    with writer:
        for b in batches:
            writer.put(b)
    return shard_id, writer.stats(), writer.memtable_stats()


def run_memwal(a, g: int, docs, qtext, qemb, exact, workdir: Path) -> dict:
    import lance
    import lancedb
    import numpy as np
    import pyarrow as pa
    from lance.mem_wal import LsmScanner, LsmVectorSearchPlanner

    res: dict = {"generations": g}
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    path = workdir / "docs.lance"
    docs = docs.cast(pk_schema(docs.schema))
    parts = bounds(docs.num_rows, g)
    first = docs.slice(0, parts[0][1])
    t = time.monotonic()
    ds, maintained = memwal_base(path, first)
    res["base_seconds"] = round(time.monotonic() - t, 3)
    res["base_rows"] = first.num_rows
    res["base_indexes"] = {
        "emb_idx": f"IVF_PQ cosine, {ivf_partitions(first.num_rows)} partitions, 16 sub-vectors",
        "text_idx": "INVERTED on text",
    }
    res["maintained_indexes"] = maintained
    batches = [docs.slice(lo, hi - lo).combine_chunks().to_batches()[0] for lo, hi in parts[1:]]
    t = time.monotonic()
    shard_id, wstats, mstats = memwal_write(ds, batches, docs.num_rows)
    res["write_seconds"] = round(time.monotonic() - t, 3)
    res["writer_stats"] = wstats
    snap, gens = shard_snapshot(path, shard_id)
    res["flushed_generations"] = len(gens)
    ds = lance.dataset(str(path))
    rows = LsmScanner.from_snapshots(ds, [snap]).count_rows()
    res["rows_visible"] = rows
    gen_index_types = set()
    for folder in gens.values():
        for idx in lance.dataset(str(path / "_mem_wal" / shard_id / folder)).list_indices():
            gen_index_types.add(f"{idx['name']}: {idx['type']}")
    res["generation_indexes"] = sorted(gen_index_types)
    log(
        f"  memwal G={g}: base of {first.num_rows} rows + indexes in {res['base_seconds']:.1f}s, "
        f"{len(batches)} puts through a ShardWriter -> {len(gens)} flushed generations in "
        f"{res['write_seconds']:.1f}s; {rows} rows visible to the LSM scanner"
    )
    planner = LsmVectorSearchPlanner(ds, [snap], "emb", distance_type="cosine")

    def vector(i):
        plan = planner.plan_search(
            pa.array(np.asarray(qemb[i], dtype=np.float32)),
            k=K,
            nprobes=a.memwal_nprobes,
            columns=COLUMNS,
            refine_base_table=True,
        )
        return plan.to_table()["id"].to_pylist()

    table = lancedb.connect(str(workdir)).open_table("docs")

    def fts(i):
        r = (
            table.search(qtext[i], query_type="fts", fts_columns="text")
            .use_lsm(True)
            .limit(K)
            .select(COLUMNS)
            .to_arrow()
        )
        return r["id"].to_pylist()

    def vector_lancedb(i):
        r = (
            table.search(np.asarray(qemb[i], dtype=np.float32), vector_column_name="emb")
            .distance_type("cosine")
            .use_lsm(True)
            .limit(K)
            .select(COLUMNS)
            .to_arrow()
        )
        return r["id"].to_pylist()

    items = list(range(len(qtext)))
    budget = a.max_seconds_per_series
    for name, fn, ex in (
        ("vector", vector, exact),
        ("fts", fts, None),
        ("vector_lancedb_lsm", vector_lancedb, exact),
    ):
        with Step(f"  memwal G={g}: {name} queries"):
            try:
                res[name] = run_series(fn, items, a.queries, budget, ex, first.num_rows)
            except Exception as e:  # noqa: BLE001
                res[name] = {"error": short_error(e)}
                log(f"  memwal G={g}: {name}: {res[name]['error']}")
    try:
        res["vector_plan"] = planner.plan_search(
            pa.array(np.asarray(qemb[0], dtype=np.float32)), k=K, nprobes=a.memwal_nprobes,
            columns=COLUMNS, refine_base_table=True,
        ).explain()
        res["fts_plan"] = (
            table.search(qtext[0], query_type="fts", fts_columns="text")
            .use_lsm(True)
            .limit(K)
            .select(COLUMNS)
            .explain_plan(True)
        )
    except Exception as e:  # noqa: BLE001
        res["plan_error"] = short_error(e)
    return res


# ---------------------------------------------------------------------------------------
# Capability probe: what each peer does with the configurations the benchmark avoids
# ---------------------------------------------------------------------------------------


def probe(docs, qtext, qemb, workdir: Path) -> dict:
    """Try the configurations the benchmark does not use, on a few rows, and record what
    happens (the exact error text of this installation, or the outcome)."""
    import lance
    import lancedb
    import numpy as np
    import pyarrow as pa
    from lancedb import LsmWriteSpec
    from lancedb.query import MultiMatchQuery
    from lance.mem_wal import LsmVectorSearchPlanner

    out: dict = {}
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    n = min(docs.num_rows, 2000)
    half = n // 2
    small = docs.slice(0, n)
    v = np.asarray(qemb[0], dtype=np.float32)

    def attempt(key, fn):
        try:
            out[key] = {"ok": True, "result": fn()}
        except Exception as e:  # noqa: BLE001
            out[key] = {"ok": False, "error": short_error(e)}

    # LanceDB: full text without an index; appended rows after an index.
    db = lancedb.connect(str(workdir / "lancedb"))
    t = db.create_table("docs", small.slice(0, half))
    attempt(
        "lancedb_fts_without_index",
        lambda: t.search(qtext[0], query_type="fts").limit(K).to_arrow().num_rows,
    )
    lancedb_fts_index(t, "text")
    t.add(small.slice(half))

    def appended():
        plan = t.search(qtext[0], query_type="fts", fts_columns="text").limit(K).explain_plan(True)
        st = t.index_stats("text_idx")
        flat = "FlatMatchQuery" in plan or "HybridCompoundFtsScorer" in plan
        return {
            "indexed_rows": st.num_indexed_rows,
            "unindexed_rows": st.num_unindexed_rows,
            "plan_scans_unindexed_rows": flat,
        }

    attempt("lancedb_fts_after_append", appended)
    def fast_search():
        ids = (
            t.search(qtext[0], query_type="fts", fts_columns="text").fast_search().limit(K)
            .select(["id"]).to_arrow()["id"].to_pylist()
        )
        return {"rows": len(ids), "rows_from_unindexed_batch": sum(1 for i in ids if i >= half)}

    def normal_search():
        ids = (
            t.search(qtext[0], query_type="fts", fts_columns="text").limit(K)
            .select(["id"]).to_arrow()["id"].to_pylist()
        )
        return {"rows": len(ids), "rows_from_unindexed_batch": sum(1 for i in ids if i >= half)}

    attempt("lancedb_fts_after_append_hits", normal_search)
    attempt("lancedb_fast_search_fts_after_append", fast_search)

    # LanceDB MemWAL write path on a local table.
    t2 = db.create_table("lsm", small.slice(0, half))
    attempt("lancedb_set_unenforced_primary_key", lambda: t2.set_unenforced_primary_key("id"))
    attempt("lancedb_set_lsm_write_spec", lambda: t2.set_lsm_write_spec(LsmWriteSpec.unsharded()))
    attempt("lancedb_flush_lsm_local", lambda: t2.flush_lsm())
    attempt("lancedb_get_lsm_stats_local", lambda: t2.get_lsm_stats())

    # Lance MemWAL: which planners exist.
    import lance.mem_wal as mw

    out["lance_mem_wal_api"] = sorted(mw.__all__)
    out["lance_mem_wal_has_fts_planner"] = any("fts" in n.lower() or "text" in n.lower() for n in mw.__all__)

    # Lance MemWAL without a vector index on the base table (flat vector search?).
    schema = pk_schema(small.schema)
    base = small.slice(0, half).cast(schema)
    path = workdir / "memwal-noindex" / "docs.lance"
    path.parent.mkdir(parents=True)
    ds, _ = memwal_base(path, base, vector_index=False, fts_index=False)
    rest = small.slice(half).cast(schema).combine_chunks().to_batches()
    sid, _, _ = memwal_write(ds, rest, n)
    snap, gens = shard_snapshot(path, sid)
    ds = lance.dataset(str(path))

    def flat_vector():
        plan = LsmVectorSearchPlanner(ds, [snap], "emb", distance_type="cosine").plan_search(
            pa.array(v), k=K, columns=["id"]
        )
        return {"rows_returned": plan.to_table().num_rows, "rows_in_lsm": n, "generations": len(gens)}

    attempt("memwal_vector_without_index", flat_vector)
    tl = lancedb.connect(str(path.parent)).open_table("docs")
    attempt(
        "memwal_lancedb_fts_without_index",
        lambda: tl.search(qtext[0], query_type="fts", fts_columns="text").use_lsm(True).limit(K)
        .to_arrow().num_rows,
    )
    attempt(
        "memwal_lancedb_vector_without_index",
        lambda: tl.search(v, vector_column_name="emb").distance_type("cosine").use_lsm(True)
        .limit(K).to_arrow().num_rows,
    )

    # Lance MemWAL with indexes: multi-column full text through LanceDB's LSM reader.
    path = workdir / "memwal-indexed" / "docs.lance"
    path.parent.mkdir(parents=True)
    ds, _ = memwal_base(path, base)
    sid, _, _ = memwal_write(ds, rest, n)
    tl = lancedb.connect(str(path.parent)).open_table("docs")
    attempt(
        "memwal_lancedb_fts_title_and_text",
        lambda: tl.search(MultiMatchQuery(qtext[0], ["title", "text"]), query_type="fts")
        .use_lsm(True).limit(K).to_arrow().num_rows,
    )
    attempt(
        "memwal_lancedb_fts_default_columns",
        lambda: tl.search(qtext[0], query_type="fts").use_lsm(True).limit(K).to_arrow().num_rows,
    )
    attempt(
        "memwal_lancedb_fts_text",
        lambda: tl.search(qtext[0], query_type="fts", fts_columns="text").use_lsm(True).limit(K)
        .to_arrow().num_rows,
    )
    shutil.rmtree(workdir, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def fmt_cell(entry, notes: list, note_for_error: dict) -> str:
    if entry is None:
        return "-"
    if "error" in entry:
        err = entry["error"]
        if err not in note_for_error:
            notes.append(err)
            note_for_error[err] = len(notes)
        return f"n/a [{note_for_error[err]}]"
    if entry.get("unsupported"):
        reason = entry["unsupported"]
        if reason not in note_for_error:
            notes.append(reason)
            note_for_error[reason] = len(notes)
        return f"n/a [{note_for_error[reason]}]"
    p50 = entry.get("p50_ms")
    if p50 is None:
        return "-"
    s = f"{p50:.2f}"
    if entry.get("samples") is not None and entry.get("time_guard_hit"):
        s += f" ({entry['samples']}q)*"
    return s


def main() -> int:
    a = parse_args()
    binary = resolve(a.lsmsearch)
    out = resolve(a.out)
    data = resolve(a.data)
    if not binary.exists():
        print(
            f"lsmsearch binary not found at {binary}: run `cargo build --release` in {ROOT} "
            "(or pass --lsmsearch PATH)",
            file=sys.stderr,
        )
        return 2
    if not (data / "docs.jsonl").exists():
        print(f"the Cranfield collection is not at {data} (pass --data DIR)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    launcher = os.environ.get("PEERS_LAUNCHER")
    command = (
        " ".join([launcher, shlex.join(sys.argv[1:])]).strip()
        if launcher
        else shlex.join([sys.executable, *sys.argv])
    )
    commands: list[str] = []

    import lance
    import lancedb
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    versions = {
        "lsmsearch": lsmsearch_version(binary),
        "lancedb": lancedb.__version__,
        "pylance": lance.__version__,
        "pyarrow": pa.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    log(f"versions: {versions}")
    report: dict = {
        "command": command,
        "config": {
            "docs": a.docs,
            "gens": a.gens,
            "queries": a.queries,
            "k": K,
            "dim": DIM,
            "max_seconds_per_series": a.max_seconds_per_series,
            "memwal_nprobes": a.memwal_nprobes,
            "systems": a.systems,
            "out": str(out),
            "data": str(data),
        },
        "versions": versions,
        "lsmsearch_commands": commands,
    }

    with Step(f"1. export the corpus ({a.docs} docs, {DIM}-d) with lsmsearch bench corpus"):
        export_corpus(a, binary, out / "corpus", data, commands)
        docs = pq.read_table(out / "corpus" / "docs.parquet")
        queries = pq.read_table(out / "corpus" / "queries.parquet")
        qtext = queries["text"].to_pylist()
        qemb = np.stack(queries["emb"].to_numpy(zero_copy_only=False)).astype(np.float32)
        emb = np.stack(docs["emb"].to_numpy(zero_copy_only=False)).astype(np.float32)
        exact = exact_neighbours(emb, docs["id"].to_numpy(), qemb)
        log(f"  {docs.num_rows} docs, {len(qtext)} queries; exact cosine top-{K} computed")

    results: dict = {"lsmsearch": {}, "lancedb": {}, "memwal": {}}
    if "lsmsearch" in a.systems:
        with Step("2. lsmsearch bench generations (no added latency)"):
            try:
                r = run_lsmsearch(a, binary, out / "lsmsearch", data, commands)
                results["lsmsearch"] = r["per_g"]
                report["lsmsearch_report"] = r["report"]
            except Exception as e:  # noqa: BLE001
                log(f"  lsmsearch failed: {short_error(e)}")
                results["lsmsearch"] = {g: {"fts": {"error": short_error(e)}, "vector": {"error": short_error(e)}} for g in a.gens}

    if "lancedb" in a.systems or "memwal" in a.systems:
        with Step("probe: peer configurations the benchmark avoids"):
            try:
                report["probe"] = probe(docs, qtext, qemb, out / "probe")
            except Exception as e:  # noqa: BLE001
                report["probe"] = {"error": short_error(e), "traceback": traceback.format_exc()}
                log(f"  probe failed: {short_error(e)}")

    if "lancedb" in a.systems:
        with Step("3. LanceDB: table.add x G, FTS indexes after batch 1, flat vectors"):
            for g in a.gens:
                with Step(f" lancedb G={g}"):
                    try:
                        results["lancedb"][g] = run_lancedb(
                            a, g, docs, qtext, qemb, exact, out / f"lancedb-{g}"
                        )
                    except Exception as e:  # noqa: BLE001
                        err = short_error(e)
                        log(f"  lancedb G={g} failed: {err}")
                        results["lancedb"][g] = {"fts": {"error": err}, "vector": {"error": err}}
                    if not a.keep:
                        shutil.rmtree(out / f"lancedb-{g}", ignore_errors=True)

    if "memwal" in a.systems:
        with Step("4. Lance MemWAL: base + (G-1) sealed ShardWriter generations"):
            for g in a.gens:
                with Step(f" memwal G={g}"):
                    try:
                        results["memwal"][g] = run_memwal(
                            a, g, docs, qtext, qemb, exact, out / f"memwal-{g}"
                        )
                    except Exception as e:  # noqa: BLE001
                        err = short_error(e)
                        log(f"  memwal G={g} failed: {err}")
                        results["memwal"][g] = {"fts": {"error": err}, "vector": {"error": err}}
                    if not a.keep:
                        shutil.rmtree(out / f"memwal-{g}", ignore_errors=True)

    report["results"] = {s: {str(g): v for g, v in r.items()} for s, r in results.items()}

    # ---- table ----
    notes: list[str] = []
    note_for: dict[str, int] = {}
    header = [
        "gens",
        "lsmsearch fts p50",
        "lsmsearch vector p50",
        "lancedb fts p50",
        "lancedb vector p50",
        "memwal fts p50",
        "memwal vector p50",
    ]
    rows = []
    for g in a.gens:
        row = [str(g)]
        for system in ("lsmsearch", "lancedb", "memwal"):
            for kind in ("fts", "vector"):
                if system not in a.systems:
                    row.append("not run")
                    continue
                row.append(fmt_cell(results[system].get(g, {}).get(kind), notes, note_for))
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [
        " | ".join(h.rjust(w) for h, w in zip(header, widths)),
        "-+-".join("-" * w for w in widths),
        *(" | ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows),
    ]
    table = "\n".join(lines)
    report["table"] = table

    # Per series: queries measured, recall against exact cosine top-10, and the share of
    # hits from rows of batches 2..G (unindexed rows for LanceDB, flushed generations for
    # MemWAL), which shows whether those rows are searched at all.
    recall_lines = []
    for system, kind in (
        ("lancedb", "fts"),
        ("lancedb", "vector"),
        ("memwal", "fts"),
        ("memwal", "vector"),
        ("memwal", "vector_lancedb_lsm"),
    ):
        vals = []
        for g in a.gens:
            e = results[system].get(g, {}).get(kind) or {}
            if e.get("samples") is None:
                continue
            v = f"G={g}: {e['samples']}q"
            if e.get("p50_ms") is not None:
                v += f", p50 {e['p50_ms']:.2f} ms"
            if e.get("recall_at_10") is not None:
                v += f", recall {e['recall_at_10']:.2f}"
            if g > 1 and e.get("hits_from_later_batches") is not None:
                v += f", {100 * e['hits_from_later_batches']:.0f}% of hits from batches 2..G"
            vals.append(v)
        if vals:
            recall_lines.append(f"  {system} {kind}: " + "; ".join(vals))

    text = [
        "",
        f"command: {command}",
        f"lsmsearch commands: " + ("\n  ".join([""] + commands) if commands else "(none)"),
        "",
        f"Query latency p50 in ms, {a.docs} docs appended in G batches, k={K}, "
        f"{a.queries} queries per cell after a warm-up pass (Cranfield queries, cycled):",
        "",
        table,
        "",
    ]
    if any("*" in c for r in rows for c in r):
        text.append(
            f"* the {a.max_seconds_per_series:.0f}s time guard per series was hit: p50 over the "
            "(n) queries measured (n q); the warm-up may also have been cut short."
        )
    for i, n in enumerate(notes, 1):
        text.append(f"[{i}] {n}")
    text += ["", "Notes:"] + notes_text(a, results, report, versions, recall_lines)
    out_text = "\n".join(text)
    print(out_text)
    report["notes"] = out_text
    (out / "peers.json").write_text(json.dumps(report, indent=2, default=str))
    log(f"wrote {out / 'peers.json'}")
    return 0


def notes_text(a, results, report, versions, recall_lines) -> list[str]:
    probe = report.get("probe", {})

    def pr(key):
        e = probe.get(key)
        if e is None:
            return "not probed"
        return f"probe: {e['result']}" if e.get("ok") else f"probe error: {e['error']}"

    def first(system, key):
        for g in a.gens:
            v = results[system].get(g, {}).get(key)
            if v:
                return v
        return None

    late = []
    for g in a.gens:
        f = results["lancedb"].get(g, {})
        idx = f.get("fts_index")
        frac = (f.get("fts") or {}).get("hits_from_later_batches")
        if idx:
            late.append(
                f"G={g}: {idx['num_indexed_rows']} indexed / {idx['num_unindexed_rows']} unindexed"
                + (f", {100 * frac:.0f}% of top-10 hits from unindexed rows" if frac is not None else "")
            )
    lsm_vec_blind = [
        g
        for g in a.gens
        if g > 1
        and (results["memwal"].get(g, {}).get("vector_lancedb_lsm") or {}).get(
            "hits_from_later_batches"
        )
        == 0
    ]
    gens_mw = [
        f"G={g}: {results['memwal'][g].get('flushed_generations')} generations + base of "
        f"{results['memwal'][g].get('base_rows')} rows, {results['memwal'][g].get('rows_visible')} rows visible"
        for g in a.gens
        if g in results["memwal"] and "flushed_generations" in results["memwal"][g]
    ]
    n = [
        f"- versions: lsmsearch {versions['lsmsearch']}, lancedb {versions['lancedb']}, "
        f"pylance {versions['pylance']}, pyarrow {versions['pyarrow']}, numpy {versions['numpy']}, "
        f"Python {versions['python']}, {versions['cpus']} CPUs, {versions['platform']}.",
        "- lsmsearch: `bench generations` with --get-latency-ms 0 --put-latency-ms 0 (plain local "
        "disk): N-1000 rows in G flushed generations plus a 1000-row memtable (WAL); warm p50 "
        "(one read-only handle, after a warm-up pass over the same queries). Full text: BM25 with "
        "global statistics over title+text (tantivy `default` tokenizer, OR of the terms); "
        "vector: each generation's HNSW graph, candidates re-scored exactly, exact scan of the "
        "memtable; cosine.",
        "- LanceDB: a fresh local table per G (DIR/lancedb-G), N rows appended with table.add in G "
        "equal batches. Full text needs an inverted index: without one, search fails "
        f"({pr('lancedb_fts_without_index')}). Native FTS indexes on title and on text (tokenizer "
        "simple, lowercase, no stemming, no stop words, no ASCII folding, max token 40: like "
        "lsmsearch's) are built ONCE, right after the first batch, and never rebuilt or "
        "optimized; the later G-1 batches stay unindexed. Queries are MultiMatchQuery(title, text), "
        "OR of the terms. Rows appended after the index ARE searched: the plan unions the index "
        "with a flat BM25 scan of the unindexed fragments (HybridCompoundFtsScorer / "
        f"FlatMatchQuery) ({pr('lancedb_fts_after_append')}; top-10 of one query: "
        f"{pr('lancedb_fts_after_append_hits')}); with fast_search() they are skipped "
        f"({pr('lancedb_fast_search_fts_after_append')}). Per G: " + "; ".join(late) + ". "
        "Vector: no vector index, flat exact kNN (KNNVectorDistance, cosine) over every row.",
        "- Lance MemWAL: per G, the first of the G batches is written as the base dataset "
        "(DIR/memwal-G/docs.lance) with an IVF_PQ index on emb (cosine, sqrt(rows) partitions up "
        "to 256, 16 sub-vectors) and an INVERTED index on text (same tokenizer); "
        "initialize_mem_wal(unsharded=True, maintained_indexes=[emb_idx, text_idx]). The other "
        "G-1 batches are put through one ShardWriter (dataset.mem_wal_writer) with "
        "max_memtable_batches=1, so every put seals the memtable and the writer flushes it as its "
        "own generation (the ShardWriter has no explicit seal/flush call besides close(); "
        f"LanceDB's flush_lsm on a local table: {pr('lancedb_flush_lsm_local')}). Flushed "
        f"generations carry rebuilt indexes ({', '.join(first('memwal', 'generation_indexes') or ['?'])}). "
        "So G = base + G-1 generations (at G=1 only the base table, the MemWAL stays empty). "
        + ("Per G: " + "; ".join(gens_mw) + ". " if gens_mw else "")
        + "The base table is needed because the vector index must be trained on rows and "
        "MemWAL only indexes generations for indexes the base table has; without one, "
        "LsmVectorSearchPlanner silently returns nothing "
        f"({pr('memwal_vector_without_index')}). The ShardSnapshot is built from the "
        "_mem_wal/<shard>/<x>_gen_<n> directories (no Python call lists a shard's generations).",
        "- memwal vector: lance.mem_wal.LsmVectorSearchPlanner(dataset, [snapshot], 'emb', "
        f"distance_type='cosine').plan_search(k=10, nprobes={a.memwal_nprobes}, refine_base_table=True): one ANN "
        "arm per source (IVF_PQ base, IVF_HNSW_SQ generations) with primary-key staleness "
        "filtering, merged by distance.",
        "- memwal fts: lance.mem_wal has no full-text planner (its API: "
        f"{', '.join(probe.get('lance_mem_wal_api', []))}). Full text was measured through "
        "LanceDB's MemWAL reader on the same dataset: lancedb.connect(DIR/memwal-G)"
        ".open_table('docs').search(q, query_type='fts', fts_columns='text').use_lsm(True): one "
        "MatchQuery per source (base and each generation, each on its own inverted index), merged "
        "by _score. Only ONE column can be searched (title+text: "
        f"{pr('memwal_lancedb_fts_title_and_text')}; no column given: "
        f"{pr('memwal_lancedb_fts_default_columns')}), so memwal fts searches text only, while "
        "lsmsearch and LanceDB search title+text. Without a maintained FTS index: "
        f"{pr('memwal_lancedb_fts_without_index')}.",
        "- The same LanceDB reader also does vector kNN over the MemWAL (use_lsm(True); JSON key "
        "vector_lancedb_lsm, not in the table)"
        + (
            ", but here it returned no rows from the flushed generations (0% of hits from "
            "batches 2..G at " + ", ".join(f"G={g}" for g in lsm_vec_blind) + "): its generation "
            "arms appear in the plan yet contribute nothing, so only the base table is searched"
            if lsm_vec_blind
            else ""
        )
        + ". Without a maintained vector index: "
        f"{pr('memwal_lancedb_vector_without_index')}.",
        "- Peers' queries return id, year, bucket plus the score/distance (what lsmsearch returns: "
        "key, payload, score); p50 is nearest-rank, as lsmsearch computes it. Timings include the "
        "Python call. lsmsearch recall is not measured here.",
    ]
    if recall_lines:
        n.append(
            "- per series: queries measured; vector recall@10 against the exact cosine top-10 "
            "(numpy brute force); share of the top-10 hits that are rows of batches 2..G "
            "(for LanceDB the rows appended after the FTS index, for MemWAL the flushed "
            "generations; with equal batches a search that covers every row gives roughly "
            "(G-1)/G):"
        )
        n.extend(recall_lines)
    return n


if __name__ == "__main__":
    sys.exit(main())
