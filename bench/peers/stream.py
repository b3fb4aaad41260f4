#!/usr/bin/env python3
"""Queries while writes flow: lsmsearch against Lance MemWAL and LanceDB, on local disk, in one
run, with the same writer schedule, rows and queries.

One writer appends Durable batches of B rows on a fixed schedule (a target rate in rows/s): new
keys, 10% updates of earlier keys, and a delete of 1% of B earlier keys per batch. Readers
alternate full-text and vector queries (the Cranfield queries and their embeddings, k = 10) at a
target rate in queries/s in total. Each system runs alone for D seconds:

* lsmsearch: `lsmsearch bench stream` with the same options (it makes its rows from the same
  corpus and checks recall and full-text equivalence on snapshots; its figures are read from
  its results.json).
* Lance MemWAL: a base dataset of the first `--base` rows carrying the IVF-PQ and inverted
  indexes MemWAL maintains; one ShardWriter (`durable_write=True`, its defaults) takes the
  puts and deletes. Readers plan vector queries with LsmVectorSearchPlanner over the base and
  the flushed generations listed when the query starts, and full-text queries with LanceDB's
  MemWAL reader (`use_lsm`). Neither reader can search the writer's active memtable (the Python
  API offers only a scan of it): rows are searchable once their memtable is flushed.
* LanceDB: a table of the first `--base` rows with an IVF-PQ and a full-text index; the writer
  upserts each batch (`merge_insert` on the key), deletes, and runs `optimize()` every
  `--optimize-every` batches (timed as part of that append). Readers open the table with
  strong read consistency, so every query sees every acknowledged write.

Prints, per system, the rows/s the writer kept, append p50/p99/max, and per query kind
p50/p99/max; writes OUT/stream.json. See README.md.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peers  # noqa: E402  (the shared helpers: corpus export, MemWAL base, tokenizer)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=100, help="rows per append")
    p.add_argument("--rate", type=float, default=2000, help="writer target, rows/s")
    p.add_argument("--readers", type=int, default=2)
    p.add_argument("--qps", type=float, default=20, help="queries/s of all readers")
    p.add_argument("--seconds", type=float, default=180)
    p.add_argument("--interval", type=float, default=30)
    p.add_argument("--base", type=int, default=10_000, help="peers: rows of the indexed base")
    p.add_argument("--optimize-every", type=int, default=50)
    p.add_argument("--lsmsearch", default=str(peers.ROOT / "target/release/lsmsearch"))
    p.add_argument("--out", default=str(peers.ROOT / "bench-out/peers-stream"))
    p.add_argument("--data", default=str(peers.ROOT / "tests/data/cranfield"))
    p.add_argument("--systems", default="lsmsearch,memwal,lancedb")
    a = p.parse_args()
    # The rows the writer may need (new keys only consume the corpus), with a margin.
    a.docs = a.base + int(a.rate * a.seconds * 1.2) + 10 * a.batch
    return a


def latency(ms: list[float]) -> dict:
    s = sorted(ms)
    return {
        "count": len(s),
        "p50_ms": peers.pct(s, 0.50) if s else None,
        "p99_ms": peers.pct(s, 0.99) if s else None,
        "max_ms": s[-1] if s else None,
    }


class Stream:
    """One writer on a fixed schedule and paced readers, against one system's calls."""

    def __init__(self, a, docs, qtext, qemb):
        self.a = a
        self.docs = docs
        self.qtext = qtext
        self.qemb = qemb
        self.appends: list[tuple[float, float, int]] = []  # (t, ms, rows)
        self.queries: dict[str, list[tuple[float, float]]] = {"fts": [], "vector": []}
        self.errors: dict[str, str] = {}
        self.stop = threading.Event()

    def batches(self):
        """Each batch: its rows (new keys from the corpus, 10% of them updates of earlier
        keys carrying a new row's content) and the earlier keys it deletes."""
        import pyarrow as pa

        rng = random.Random(7)
        next_row = self.a.base
        deletes = max(1, self.a.batch // 100)
        while True:
            rows = self.docs.slice(next_row, self.a.batch)
            next_row += self.a.batch
            ids = rows["id"].to_pylist()
            for i in range(len(ids)):
                if rng.random() < 0.10:
                    ids[i] = rng.randrange(0, next_row - self.a.batch)
            ids = list(dict.fromkeys(ids))  # one version of a key per batch
            rows = rows.slice(0, len(ids)).set_column(
                0, self.docs.schema.field("id"), pa.array(ids, pa.int64())
            )
            doomed = [rng.randrange(0, next_row - self.a.batch) for _ in range(deletes)]
            doomed = [d for d in dict.fromkeys(doomed) if d not in set(ids)]
            yield rows, doomed

    def writer(self, put, delete):
        t0 = self.t0
        n = 0
        for rows, doomed in self.batches():
            due = t0 + n * self.a.batch / self.a.rate
            n += 1
            now = time.monotonic()
            if now >= t0 + self.a.seconds:
                return
            if due > now:
                time.sleep(due - now)
            s = time.monotonic()
            try:
                put(rows, n)
                if doomed:
                    delete(doomed)
            except Exception as e:  # noqa: BLE001
                self.errors.setdefault("append", peers.short_error(e))
                self.stop.set()
                return
            self.appends.append((s - t0, (time.monotonic() - s) * 1e3, rows.num_rows))

    def reader(self, r, search):
        t0 = self.t0
        period = self.a.readers / self.a.qps
        i = r
        while not self.stop.is_set():
            due = t0 + (i // self.a.readers) * period + r * period / self.a.readers
            now = time.monotonic()
            if now >= t0 + self.a.seconds:
                return
            if due > now:
                time.sleep(due - now)
            kind = "fts" if i % 2 == 0 else "vector"
            q = (i // 2) % len(self.qtext)
            s = time.monotonic()
            try:
                search[kind](q)
            except Exception as e:  # noqa: BLE001
                self.errors.setdefault(kind, peers.short_error(e))
            else:
                self.queries[kind].append((s - t0, (time.monotonic() - s) * 1e3))
            i += self.a.readers

    def run(self, name, put, delete, search) -> dict:
        self.t0 = time.monotonic() + 0.5
        threads = [threading.Thread(target=self.writer, args=(put, delete))]
        threads += [
            threading.Thread(target=self.reader, args=(r, search)) for r in range(self.a.readers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        a = self.a
        peers.log(f"{name}: {'t(s)':>6} {'rows/s':>8} {'append p50/p99/max':>22} "
                  f"{'fts p50/p99':>14} {'vector p50/p99':>16}")
        t = 0.0
        while t < a.seconds:
            w = [x for x in self.appends if t <= x[0] < t + a.interval]
            f = [x[1] for x in self.queries["fts"] if t <= x[0] < t + a.interval]
            v = [x[1] for x in self.queries["vector"] if t <= x[0] < t + a.interval]
            al, fl, vl = latency([x[1] for x in w]), latency(f), latency(v)
            peers.log(
                f"{name}: {t + a.interval:>6.0f} {sum(x[2] for x in w) / a.interval:>8.0f} "
                f"{fmt(al['p50_ms'])}/{fmt(al['p99_ms'])}/{fmt(al['max_ms'], 0)} "
                f"{fmt(fl['p50_ms'])}/{fmt(fl['p99_ms'])} {fmt(vl['p50_ms'])}/{fmt(vl['p99_ms'])}"
            )
            t += a.interval
        rows = sum(x[2] for x in self.appends)
        return {
            "system": name,
            "rows": rows,
            "rows_per_s": rows / a.seconds,
            "append": latency([x[1] for x in self.appends]),
            "queries": {k: latency([x[1] for x in v]) for k, v in self.queries.items()},
            "errors": self.errors,
        }


def fmt(v, digits=1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def run_lsmsearch(a, out: Path, **_) -> dict:
    target = out / "lsmsearch"
    cmd = [
        a.lsmsearch, "bench", "stream",
        "--batch", str(a.batch), "--rate", str(a.rate),
        "--readers", str(a.readers), "--kinds", "fts,vector", "--qps", str(a.qps),
        "--seconds", str(a.seconds), "--interval", str(a.interval),
        "--out", str(target), "--data", str(a.data),
    ]
    peers.log("lsmsearch: " + " ".join(cmd))
    subprocess.run(cmd, check=True)
    r = json.loads((target / "results.json").read_text())
    return {
        "system": "lsmsearch",
        "rows": r["rows"],
        "rows_per_s": r["rows_per_s"],
        "append": r["append"],
        "queries": {k: r["queries"].get(k) for k in ("fts", "vector")},
        "errors": {},
        "checkpoints": r.get("checkpoints"),
    }


def run_memwal(a, out: Path, docs, qtext, qemb) -> dict:
    import lance
    import lancedb
    import numpy as np
    import pyarrow as pa
    from lance.mem_wal import LsmVectorSearchPlanner

    path = out / "memwal" / "docs.lance"
    shutil.rmtree(path.parent, ignore_errors=True)
    path.parent.mkdir(parents=True)
    ds, _ = peers.memwal_base(path, docs.slice(0, a.base))
    shard = str(uuid.uuid4())
    writer = ds.mem_wal_writer(shard, durable_write=True)
    table = lancedb.connect(str(path.parent)).open_table("docs")

    def put(rows, _n):
        writer.put(rows)

    def delete(keys):
        writer.delete(pa.table({"id": pa.array(keys, pa.int64())}))

    def vector(q):
        snap, _ = peers.shard_snapshot(path, shard)
        planner = LsmVectorSearchPlanner(lance.dataset(str(path)), [snap], "emb",
                                         distance_type="cosine")
        plan = planner.plan_search(pa.array(np.asarray(qemb[q], dtype=np.float32)), k=peers.K,
                                   columns=peers.COLUMNS, refine_base_table=True)
        return plan.to_table().num_rows

    def fts(q):
        return (
            table.search(qtext[q], query_type="fts", fts_columns="text")
            .use_lsm(True)
            .limit(peers.K)
            .select(peers.COLUMNS)
            .to_arrow()
            .num_rows
        )

    s = Stream(a, docs, qtext, qemb)
    with writer:
        r = s.run("lance MemWAL", put, delete, {"fts": fts, "vector": vector})
    return r


def run_lancedb(a, out: Path, docs, qtext, qemb) -> dict:
    from datetime import timedelta

    import lancedb
    import numpy as np
    from lancedb.query import MultiMatchQuery

    path = out / "lancedb"
    shutil.rmtree(path, ignore_errors=True)
    db = lancedb.connect(str(path))
    base = docs.slice(0, a.base)
    tbl = db.create_table("docs", base)
    tbl.create_index(metric="cosine", vector_column_name="emb",
                     num_partitions=peers.ivf_partitions(base.num_rows), num_sub_vectors=16)
    peers.lancedb_fts_index(tbl, "text")
    readers = lancedb.connect(str(path), read_consistency_interval=timedelta(0)).open_table("docs")

    def put(rows, n):
        tbl.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(rows)
        if n % a.optimize_every == 0:
            tbl.optimize()

    def delete(keys):
        tbl.delete(f"id IN ({','.join(map(str, keys))})")

    def fts(q):
        return (readers.search(MultiMatchQuery(qtext[q], ["text"]), query_type="fts")
                .limit(peers.K).select(peers.COLUMNS).to_arrow().num_rows)

    def vector(q):
        return (readers.search(np.asarray(qemb[q], dtype=np.float32), vector_column_name="emb")
                .distance_type("cosine").limit(peers.K).select(peers.COLUMNS).to_arrow().num_rows)

    s = Stream(a, docs, qtext, qemb)
    return s.run(f"LanceDB (optimize every {a.optimize_every})", put, delete,
                 {"fts": fts, "vector": vector})


def main() -> int:
    import numpy as np
    import pyarrow.parquet as pq

    a = parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus"
    if not (corpus / "docs.parquet").exists():
        peers.log(f"exporting {a.docs} documents")
        peers.export_corpus(a, Path(a.lsmsearch), corpus, Path(a.data), [])
    docs = pq.read_table(corpus / "docs.parquet")
    docs = docs.cast(peers.pk_schema(docs.schema))
    queries = pq.read_table(corpus / "queries.parquet")
    qtext = queries["text"].to_pylist()
    qemb = np.stack(queries["emb"].to_numpy(zero_copy_only=False)).astype(np.float32)
    runners = {"lsmsearch": run_lsmsearch, "memwal": run_memwal, "lancedb": run_lancedb}
    results = []
    for name in a.systems.split(","):
        peers.log(f"{name}: {a.seconds:.0f} s, {a.rate:.0f} rows/s in batches of {a.batch}, "
                  f"{a.readers} readers at {a.qps:.0f} queries/s")
        try:
            r = runners[name](a, out, docs=docs, qtext=qtext, qemb=qemb)
        except Exception as e:  # a peer that fails is reported, not fatal
            r = {"system": name, "error": peers.short_error(e)}
        results.append(r)
    print(f"{'system':<30} {'rows/s':>8} {'append p50/p99/max ms':>24} "
          f"{'fts p50/p99 ms':>16} {'vector p50/p99 ms':>18}  errors")
    for r in results:
        if "error" in r:
            print(f"{r['system']:<30} error: {r['error']}")
            continue
        ap, f, v = r["append"], r["queries"]["fts"] or {}, r["queries"]["vector"] or {}
        print(
            f"{r['system']:<30} {r['rows_per_s']:>8.0f} "
            f"{fmt(ap['p50_ms']):>8}/{fmt(ap['p99_ms'])}/{fmt(ap['max_ms'], 0)} "
            f"{fmt(f.get('p50_ms')):>8}/{fmt(f.get('p99_ms'))} "
            f"{fmt(v.get('p50_ms')):>9}/{fmt(v.get('p99_ms'))}  {r.get('errors') or ''}"
        )
    (out / "stream.json").write_text(json.dumps({"options": vars(a), "results": results},
                                                indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
