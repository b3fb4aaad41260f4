#!/usr/bin/env python3
"""Warm p50 of the builds `run.sh` measured, against one of them.

    bench/alternate/summary.py OUT BASE

For each generation count and query kind: every build's median p50 over the rounds, and the
median over the rounds of its p50 divided by BASE's in the same round (the rounds' drift
cancels in that ratio).
"""
import collections
import glob
import json
import statistics
import sys

if len(sys.argv) != 3:
    sys.exit(__doc__)
out, base = sys.argv[1], sys.argv[2]
p50 = collections.defaultdict(dict)  # (build, G, kind) -> {round: p50 ms}
for path in glob.glob(f"{out}/res/*.json"):
    name, g, r = path.rsplit("/", 1)[1][: -len(".json")].rsplit("-", 2)
    with open(path) as f:
        for run in json.load(f)["runs"]:
            if run["mode"] == "warm" and int(run["generations"]) == int(g):
                p50[(name, int(g), run["query"])][int(r)] = run["p50_ms"]
builds = sorted({k[0] for k in p50} - {base})
kinds = sorted({k[2] for k in p50}, key=lambda k: (k != "fts", k != "vector", k))
print(f"warm p50, ms: median over rounds; ratio: median of the rounds' ratios to {base}")
print(f"{'G':>4} {'query':>9} {base:>10} " + " ".join(f"{b:>10} {'ratio':>8}" for b in builds))
for g in sorted({k[1] for k in p50}):
    for kind in kinds:
        b = p50.get((base, g, kind))
        if not b:
            continue
        line = f"{g:>4} {kind:>9} {statistics.median(b.values()):>10.2f} "
        for name in builds:
            x = p50.get((name, g, kind), {})
            common = sorted(set(x) & set(b))
            if not common:
                line += f"{'-':>10} {'-':>8} "
                continue
            ratio = statistics.median(x[r] / b[r] for r in common) - 1
            line += f"{statistics.median(x.values()):>10.2f} {ratio * 100:>+7.1f}% "
        print(line.rstrip() + f"  ({len(b)} rounds)")
