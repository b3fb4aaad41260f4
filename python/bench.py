"""What the Python package adds to the Rust library, measured in one run on the same data.

    python python/bench.py [--docs 200000] [--dim 128] [--rounds 3] [--repeat 4] [--query-turns 4] [--out bench-out/python]

1. ``lsmsearch bench corpus`` writes the corpus (Cranfield replicated, with vectors) and its
   queries as Parquet.
2. Ingest, 1,000-row batches, durable appends, default settings, each in a process of its
   own under ``/usr/bin/time`` (peak RSS):
   - Rust: ``lsmsearch ingest`` of the Parquet file (the whole process is timed);
   - Python: ``Index.add`` of each ``pyarrow.RecordBatch`` read from the same file (timed from
     ``create`` to ``close``, reading the file included, the interpreter's start not).
3. Warm query latency on the index the Rust ingest built, every query of the corpus, full
   text, vector and hybrid, 10 rows each:
   - Rust: ``lsmsearch bench queries``;
   - Python: ``index.search(...).limit(10).to_arrow()``, the same queries and rounds.

Rust and Python take turns (``--repeat`` ingest turns, each followed by both query runs, then
``--query-turns`` more query runs), the side that goes first alternating; each figure is the
median of its turns, and the added query time the median of the turns' differences. Prints a
table and writes OUT/results.json. Needs the release command line
(``cargo build --release``) and the package built with ``maturin develop --release``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def schema(dim: int) -> dict:
    """The corpus schema (`lsmsearch::bench::corpus::Corpus::schema`)."""
    return {
        "primary_key": "id",
        "primary_key_type": "int64",
        "text": ["title", "text"],
        "vector": {"column": "emb", "dim": dim, "metric": "cosine"},
        "payload": [{"name": "year", "type": "int64"}, {"name": "bucket", "type": "int64"}],
    }


def timed(cmd: list[str], out: pathlib.Path) -> tuple[str, float, float]:
    """Run ``cmd`` under /usr/bin/time: its stdout, wall seconds and peak RSS in MiB."""
    stats = out / "time.txt"
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%e %M", "-o", str(stats), *cmd],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    wall, rss_kb = stats.read_text().split()[-2:]
    return proc.stdout, float(wall), int(rss_kb) / 1024


def ingest_child(uri: str, parquet: str, dim: int) -> None:
    """The Python ingest, in its own process: prints rows and seconds as JSON."""
    import pyarrow.parquet as pq

    import lsmsearch

    t0 = time.perf_counter()
    index = lsmsearch.create(uri, schema=schema(dim))
    rows = 0
    for batch in pq.ParquetFile(parquet).iter_batches(batch_size=1000):
        rows += index.add(batch).rows
    index.close()
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - t0}))


def queries_child(uri: str, parquet: str, rounds: int) -> None:
    """Python's warm query latency, in its own process: prints the report as JSON."""
    import numpy as np
    import pyarrow.parquet as pq

    import lsmsearch

    table = pq.read_table(parquet)
    queries = list(zip(table.column("text").to_pylist(), table.column("emb").to_pylist()))
    queries = [(t, np.asarray(v, dtype=np.float32)) for t, v in queries]
    index = lsmsearch.open_read_only(uri)
    runs = {
        "fts": lambda q: index.search(q[0]).limit(10).to_arrow(),
        "vector": lambda q: index.search(q[1]).limit(10).to_arrow(),
        "hybrid": lambda q: index.search(q[0], q[1]).limit(10).to_arrow(),
    }
    latency = []
    for kind, run in runs.items():
        for q in queries:
            run(q)
        ms = []
        for _ in range(rounds):
            for q in queries:
                t0 = time.perf_counter()
                run(q)
                ms.append((time.perf_counter() - t0) * 1000)
        ms.sort()
        pct = lambda p: ms[round((len(ms) - 1) * p)]  # noqa: E731
        latency.append({"kind": kind, "samples": len(ms), "p50_ms": pct(0.5), "p95_ms": pct(0.95)})
    index.close()
    print(json.dumps({"queries": len(queries), "latency": latency}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=4, help="turns of each side (median reported)")
    p.add_argument("--query-turns", type=int, default=4, help="more turns of queries alone")
    p.add_argument("--out", type=pathlib.Path, default=ROOT / "bench-out" / "python")
    p.add_argument("--lsmsearch", default=str(ROOT / "target" / "release" / "lsmsearch"))
    p.add_argument("--ingest-child", nargs=2, metavar=("URI", "PARQUET"), help=argparse.SUPPRESS)
    p.add_argument("--queries-child", nargs=2, metavar=("URI", "PARQUET"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.ingest_child:
        return ingest_child(*a.ingest_child, a.dim)
    if a.queries_child:
        return queries_child(*a.queries_child, a.rounds)

    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus"
    docs, queries = corpus / "docs.parquet", corpus / "queries.parquet"
    subprocess.run(
        [a.lsmsearch, "bench", "corpus", "--docs", str(a.docs), "--dim", str(a.dim), "--out", str(corpus)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (out / "schema.json").write_text(json.dumps(schema(a.dim)))
    rust_idx, py_idx = out / "rust-index", out / "python-index"
    me = [sys.executable, __file__, "--dim", str(a.dim), "--rounds", str(a.rounds)]
    runs = []

    def rust_queries():
        return json.loads(
            subprocess.run(
                [a.lsmsearch, "--json", "bench", "queries", str(rust_idx), "--queries", str(queries),
                 "--rounds", str(a.rounds)],
                check=True, stdout=subprocess.PIPE, text=True,
            ).stdout
        )

    def py_queries():
        return json.loads(timed(me + ["--queries-child", str(rust_idx), str(queries)], out)[0])

    def query_pair(turn):
        """Rust's and Python's query reports, taken one after the other, Rust first in even
        turns."""
        if turn % 2 == 0:
            return rust_queries(), py_queries()
        py_q, rust_q = py_queries(), rust_queries()
        return rust_q, py_q

    # Rust and Python take turns, --repeat times, the side that goes first alternating: the
    # machine's drift between runs (and within one, as a 2-core virtual machine's share of
    # its host changes) is larger than what is measured, so each figure is the median of its
    # turns, half of them taken first.
    for turn in range(a.repeat):
        for d in (rust_idx, py_idx):
            shutil.rmtree(d, ignore_errors=True)
        subprocess.run(
            [a.lsmsearch, "init", str(rust_idx), "--schema", str(out / "schema.json")],
            check=True,
            stdout=subprocess.DEVNULL,
        )

        def rust_ingest():
            return timed([a.lsmsearch, "ingest", str(rust_idx), str(docs), "--batch-size", "1000"], out)

        def py_ingest():
            return timed(me + ["--ingest-child", str(py_idx), str(docs)], out)

        if turn % 2 == 0:
            (_, rust_s, rust_rss), (py_out, _, py_rss) = rust_ingest(), py_ingest()
        else:
            (py_out, _, py_rss), (_, rust_s, rust_rss) = py_ingest(), rust_ingest()
        py = json.loads(py_out)
        rust_q, py_q = query_pair(turn)
        runs.append(
            {
                "rust_rows_per_s": a.docs / rust_s,
                "rust_peak_rss_mib": rust_rss,
                "python_rows_per_s": py["rows"] / py["seconds"],
                "python_peak_rss_mib": py_rss,
                "rust_p50_ms": {r["kind"]: r["p50_ms"] for r in rust_q["latency"]},
                "python_p50_ms": {r["kind"]: r["p50_ms"] for r in py_q["latency"]},
            }
        )
    # More turns of queries alone, on the last index the Rust ingest built.
    pairs = [(r["rust_p50_ms"], r["python_p50_ms"]) for r in runs]
    for turn in range(a.repeat, a.repeat + a.query_turns):
        rust_q, py_q = query_pair(turn)
        pairs.append(
            (
                {r["kind"]: r["p50_ms"] for r in rust_q["latency"]},
                {r["kind"]: r["p50_ms"] for r in py_q["latency"]},
            )
        )
    median = statistics.median
    pick = lambda key: median([r[key] for r in runs])  # noqa: E731
    kinds = list(runs[0]["rust_p50_ms"])
    rust_p50 = {k: median([r[k] for r, _ in pairs]) for k in kinds}
    py_p50 = {k: median([p[k] for _, p in pairs]) for k in kinds}
    # Each pair's added time, Python's p50 less Rust's in the same turn: drift between turns
    # cancels out of it.
    added_ms = {k: median([p[k] - r[k] for r, p in pairs]) for k in kinds}
    added_ratio = {k: median([p[k] / r[k] - 1 for r, p in pairs]) for k in kinds}
    rust_rate, py_rate = pick("rust_rows_per_s"), pick("python_rows_per_s")
    rust_rss, py_rss = pick("rust_peak_rss_mib"), pick("python_peak_rss_mib")
    report = {
        "docs": a.docs,
        "dim": a.dim,
        "repeat": a.repeat,
        "ingest": {
            "rust_rows_per_s": rust_rate,
            "rust_peak_rss_mib": rust_rss,
            "python_rows_per_s": py_rate,
            "python_peak_rss_mib": py_rss,
            "python_over_rust": py_rate / rust_rate,
        },
        "warm_p50_ms": {"rust": rust_p50, "python": py_p50},
        "warm_p50_added_ms_median_of_pairs": added_ms,
        "warm_p50_added_ratio_median_of_pairs": added_ratio,
        "runs": runs,
        "query_pairs": pairs,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2))
    print(f"{a.docs:,} rows, {a.dim}-d, 1,000-row batches, durable appends; median of {a.repeat} turns each")
    print(f"{'ingest':>8} {'rows/s':>10} {'peak RSS MiB':>13}")
    print(f"{'rust':>8} {rust_rate:>10,.0f} {rust_rss:>13,.0f}")
    print(f"{'python':>8} {py_rate:>10,.0f} {py_rss:>13,.0f}   {py_rate / rust_rate:.1%} of Rust")
    print()
    print(
        f"warm p50 over every corpus query x {a.rounds} rounds, 10 rows; medians of {len(pairs)} "
        "turns each, and of the turns' pairs (Python less Rust in the same turn)"
    )
    print(f"{'kind':>8} {'rust ms':>9} {'python ms':>10} {'added us':>9} {'added':>7}")
    for k in kinds:
        print(
            f"{k:>8} {rust_p50[k]:>9.3f} {py_p50[k]:>10.3f} {added_ms[k] * 1000:>9.0f} "
            f"{added_ratio[k]:>7.1%}"
        )


if __name__ == "__main__":
    main()
