#!/usr/bin/env python3
"""Ingest with every index maintained, on the same rows: lsmsearch against Lance MemWAL and
LanceDB (with a periodic `optimize()`), on local disk, in one run.

The N benchmark documents (`lsmsearch bench corpus`: Cranfield text, 128-d cosine vectors)
are appended in batches of B rows, each append durable before it returns, with the full-text
and vector indexes kept up to date:

* lsmsearch: `lsmsearch ingest` (Durable appends of B rows; the memtable's graph and text
  index built in the background, generations flushed; the final flush at close included).
* Lance MemWAL: the first batch is the base dataset (IVF-PQ and inverted indexes, the ones
  MemWAL maintains); the rest go through one ShardWriter with its defaults
  (`durable_write=True`: every put's WAL entry is fsynced); the writer's close (flush) is
  timed apart.
* LanceDB: `table.add` of each batch into a table whose first batch carries an IVF-PQ and an
  FTS index, and `table.optimize()` (which folds new rows into the indexes) after every
  `--optimize-every` batches and at the end.

Prints rows/s (appends alone, and with the final flush/optimize) and the append latency
p50/p99/max per system; writes OUT/ingest.json. See README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (the shared helpers: corpus export, MemWAL base, tokenizer)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--lsmsearch", default=str(peers.ROOT / "target/release/lsmsearch"))
    p.add_argument("--out", default=str(peers.ROOT / "bench-out/peers-ingest"))
    p.add_argument("--data", default=str(peers.ROOT / "tests/data/cranfield"))
    p.add_argument("--systems", default="lsmsearch,memwal,lancedb")
    p.add_argument("--optimize-every", type=int, default=50)
    return p.parse_args()


def summary(name: str, rows: int, append_s: float, total_s: float, lat_ms: list[float]) -> dict:
    lat = sorted(lat_ms)
    return {
        "system": name,
        "rows": rows,
        "append_seconds": append_s,
        "total_seconds": total_s,
        "rows_per_s_appends": rows / append_s if append_s else None,
        "rows_per_s_total": rows / total_s if total_s else None,
        "append_p50_ms": peers.pct(lat, 0.50) if lat else None,
        "append_p99_ms": peers.pct(lat, 0.99) if lat else None,
        "append_max_ms": lat[-1] if lat else None,
    }


# The schema of `lsmsearch bench corpus` rows.
SCHEMA = {
    "primary_key": "id",
    "primary_key_type": "int64",
    "text": ["title", "text"],
    "vector": {"column": "emb", "dim": peers.DIM, "metric": "cosine"},
    "payload": [{"name": "year", "type": "int64"}, {"name": "bucket", "type": "int64"}],
}


def run_lsmsearch(a, corpus: Path, work: Path) -> dict:
    idx = work / "lsmsearch"
    shutil.rmtree(idx, ignore_errors=True)
    binary = a.lsmsearch
    (corpus / "schema.json").write_text(json.dumps(SCHEMA))
    subprocess.run(
        [binary, "init", str(idx), "--schema", str(corpus / "schema.json")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    t = time.monotonic()
    subprocess.run(
        [binary, "ingest", str(idx), str(corpus / "docs.parquet"), "--batch-size", str(a.batch)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    total = time.monotonic() - t
    # Per-append latency is not reported by the CLI; `lsmsearch bench stream` measures it.
    return summary("lsmsearch", a.docs, total, total, [])


def batches_of(a, corpus: Path):
    import pyarrow.parquet as pq

    table = pq.read_table(corpus / "docs.parquet")
    table = table.cast(peers.pk_schema(table.schema))
    return table, table.to_batches(max_chunksize=a.batch)


def run_memwal(a, corpus: Path, work: Path) -> dict:
    import pyarrow as pa

    path = work / "memwal"
    shutil.rmtree(path, ignore_errors=True)
    table, batches = batches_of(a, corpus)
    ds, _ = peers.memwal_base(path, pa.Table.from_batches(batches[:1]))
    lat = []
    writer = ds.mem_wal_writer(str(uuid.uuid4()), durable_write=True)
    t = time.monotonic()
    with writer:
        for b in batches[1:]:
            s = time.monotonic()
            writer.put(b)
            lat.append((time.monotonic() - s) * 1e3)
        appended = time.monotonic() - t
    total = time.monotonic() - t
    rows = sum(b.num_rows for b in batches[1:])
    return summary("lance MemWAL", rows, appended, total, lat)


def run_lancedb(a, corpus: Path, work: Path) -> dict:
    import lancedb
    import pyarrow as pa

    path = work / "lancedb"
    shutil.rmtree(path, ignore_errors=True)
    table, batches = batches_of(a, corpus)
    db = lancedb.connect(str(path))
    t0 = pa.Table.from_batches(batches[:1])
    tbl = db.create_table("docs", t0)
    tbl.create_index(
        metric="cosine",
        vector_column_name="emb",
        num_partitions=peers.ivf_partitions(t0.num_rows),
        num_sub_vectors=16,
    )
    peers.lancedb_fts_index(tbl, "text")
    lat = []
    t = time.monotonic()
    for i, b in enumerate(batches[1:], 1):
        s = time.monotonic()
        tbl.add(pa.Table.from_batches([b]))
        if i % a.optimize_every == 0:
            tbl.optimize()
        lat.append((time.monotonic() - s) * 1e3)
    appended = time.monotonic() - t
    tbl.optimize()
    total = time.monotonic() - t
    rows = sum(b.num_rows for b in batches[1:])
    return summary(f"LanceDB (optimize every {a.optimize_every})", rows, appended, total, lat)


def main() -> int:
    a = parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus"
    if not (corpus / "docs.parquet").exists():
        peers.log(f"exporting {a.docs} documents")
        peers.export_corpus(a, Path(a.lsmsearch), corpus, Path(a.data), [])
    results = []
    runners = {"lsmsearch": run_lsmsearch, "memwal": run_memwal, "lancedb": run_lancedb}
    for name in a.systems.split(","):
        peers.log(f"{name}: ingesting {a.docs} rows in batches of {a.batch}")
        try:
            r = runners[name](a, corpus, out)
        except Exception as e:  # a peer that fails is reported, not fatal
            r = {"system": name, "error": peers.short_error(e)}
        peers.log(json.dumps(r))
        results.append(r)
    def fmt(v, f):
        width = int(f.split(".")[0])
        return f"{'-':>{width}}" if v is None else format(v, f)

    print(f"{'system':<34} {'rows':>8} {'rows/s appends':>15} {'rows/s + flush':>15} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for r in results:
        if "error" in r:
            print(f"{r['system']:<34} error: {r['error']}")
            continue
        print(
            f"{r['system']:<34} {r['rows']:>8} {fmt(r['rows_per_s_appends'], '15.0f')} "
            f"{fmt(r['rows_per_s_total'], '15.0f')} {fmt(r['append_p50_ms'], '8.1f')} "
            f"{fmt(r['append_p99_ms'], '8.1f')} {fmt(r['append_max_ms'], '8.0f')}"
        )
    (out / "ingest.json").write_text(json.dumps({"batch": a.batch, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
