"""What a Python user expects of a native package: other threads run while it works,
Ctrl-C interrupts it, and a forked child gets a clear error instead of a hang."""

from __future__ import annotations

import _thread
import os
import threading
import time

import pyarrow as pa
import pytest

import lsmsearch
from conftest import small_rows


class Spinner:
    """A Python thread counting as fast as the GIL lets it."""

    def __init__(self) -> None:
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        while not self._stop.is_set():
            self.count += 1

    def __enter__(self) -> Spinner:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def rate(self, seconds: float) -> float:
        """Counts per second while this thread sleeps."""
        c0, t0 = self.count, time.perf_counter()
        time.sleep(seconds)
        return (self.count - c0) / (time.perf_counter() - t0)

    def during(self, call) -> tuple[float, float]:
        """Counts per second while ``call`` runs in this thread, and its duration."""
        c0, t0 = self.count, time.perf_counter()
        call()
        elapsed = time.perf_counter() - t0
        return (self.count - c0) / elapsed, elapsed


def test_other_threads_run_during_an_append_and_a_search(index):
    big = numbered_rows(100_000, index.arrow_schema)
    index.add(small_rows(1_000))
    index.flush()
    with Spinner() as s:
        alone = s.rate(0.3)
        during_add, add_s = s.during(lambda: index.add(big))
        during_search, search_s = s.during(
            lambda: [index.search("boundary layer").limit(10).to_arrow() for _ in range(30)]
        )
    print(
        f"\nspinner counts/s: alone {alone:,.0f}; during add ({add_s * 1000:.0f} ms) "
        f"{during_add:,.0f} ({during_add / alone:.0%}); during 30 searches "
        f"({search_s * 1000:.0f} ms) {during_search:,.0f} ({during_search / alone:.0%})"
    )
    # Holding the GIL through the call would leave the spinner a switch interval at most;
    # released, it shares two cores with the runtime's threads (an add keeps both busy).
    assert add_s > 0.05 and during_add > 0.25 * alone
    assert during_search > 0.4 * alone


def numbered_rows(n: int, schema: pa.Schema) -> pa.Table:
    """``n`` rows built column by column (quicker than from dicts)."""
    import numpy as np

    dim = schema.field("emb").type.list_size
    flat = pa.array(np.random.default_rng(1).standard_normal(n * dim).astype(np.float32))
    return pa.table(
        {
            "id": pa.array(np.arange(n, dtype=np.int64)),
            "title": pa.array(["shock wave"] * n),
            "text": pa.array(["a study of the boundary layer"] * n),
            "author": pa.array(["someone"] * n),
            "year": pa.array(np.full(n, 1990, dtype=np.int64)),
            "emb": pa.FixedSizeListArray.from_arrays(flat, dim),
        },
        schema=schema,
    )


def test_ctrl_c_interrupts_a_long_call(index):
    index.add(numbered_rows(20_000, index.arrow_schema))
    pairs = "SELECT count(*) AS n FROM docs a CROSS JOIN docs b WHERE a.year = b.year"
    t0 = time.perf_counter()
    small = index.sql(pairs + " AND a.id < 2000 AND b.id < 2000")
    sample = time.perf_counter() - t0
    assert small.column("n").to_pylist() == [4_000_000]
    # The whole join pairs 100 times as many rows. Python leaves SIGINT alone when it
    # started ignoring it (a background job of a shell): install its handler for the test.
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.1, _thread.interrupt_main)
    try:
        timer.start()
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            index.sql(pairs)
        interrupted = time.perf_counter() - t0
        timer.join()
    finally:
        signal.signal(signal.SIGINT, old)
    print(
        f"\n4M pairs in {sample * 1000:.0f} ms (400M would take about {sample * 100:.1f} s); "
        f"interrupted after {interrupted * 1000:.0f} ms"
    )
    assert interrupted < 0.1 + max(1.0, sample * 10)
    # The handle still works.
    assert index.search("shock").limit(3).to_arrow().num_rows == 3


def test_a_forked_child_gets_a_clear_error(uri, index):
    index.add(small_rows(5))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 0
        try:
            try:
                index.search("shock").to_arrow()
                code = 1
            except lsmsearch.ClosedError as e:
                if "fork" not in str(e):
                    code = 2
            try:
                lsmsearch.open_read_only(uri)
                code = 3
            except lsmsearch.ForkError:
                pass
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert index.scan().num_rows == 5


def test_a_child_forked_before_any_use_may_use_the_index(tmp_path):
    import subprocess
    import sys

    script = f"""
import os, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import lsmsearch
from conftest import SCHEMA, small_rows
pid = os.fork()
if pid == 0:
    idx = lsmsearch.create({str(tmp_path / "idx")!r}, schema=SCHEMA)
    idx.add(small_rows(5))
    os._exit(0 if idx.scan().num_rows == 5 else 1)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


FORK_CHILD = """
import os, sys
sys.path.insert(0, {tests!r})
import lsmsearch
from conftest import SCHEMA, small_rows
idx = lsmsearch.create({uri!r}, schema=SCHEMA)
idx.add(small_rows(50))
idx.flush()
for q in ("shock", "wave", "flow"):
    idx.search(q).to_arrow()
idx.search(small_rows(1)[0]["emb"]).to_arrow()
idx.sql("SELECT count(*) FROM docs")
codes = []
for _ in range(6):
    pid = os.fork()
    if pid == 0:
        try:
            lsmsearch.open({uri!r}).add(small_rows(1, 500))
            os._exit(1)
        except lsmsearch.ForkError as e:
            if "spawn" not in str(e):
                os._exit(2)
        except BaseException:
            os._exit(3)
        # The parent's handle: closing it does nothing, dropping it leaks it.
        idx.close()
        del idx
        import gc
        gc.collect()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    codes.append(os.waitstatus_to_exitcode(status))
print(codes)
"""


def test_a_child_forked_after_use_is_refused_not_crashed(tmp_path):
    """The parent's runtime threads are gone in the child, and locks they held stay held:
    a child of a process that used lsmsearch gets ForkError, never a crash."""
    import subprocess
    import sys

    tests = os.path.dirname(os.path.abspath(__file__))
    script = FORK_CHILD.format(tests=tests, uri=str(tmp_path / "idx"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([0] * 6), out.stdout + out.stderr


def test_a_signal_handler_may_call_the_index(index):
    import signal

    index.add(numbered_rows(20_000, index.arrow_schema))
    seen = []

    def handler(signum, frame):
        seen.append(index.search("shock").limit(2).to_arrow().num_rows)

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        index.sql("SELECT count(*) AS n FROM docs a JOIN docs b ON a.year = b.year WHERE a.id < 5000")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert seen == [2]
