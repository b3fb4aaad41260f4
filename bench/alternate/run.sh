#!/usr/bin/env bash
# Two or more builds of lsmsearch measured side by side: each round runs `bench generations
# --gens G --reuse --cold-queries 1` with every build for each G, the builds' order rotating from
# round to round, so that the machine's drift over the run weighs on every build alike.
#
#   bench/alternate/run.sh ROUNDS OUT NAME=BINARY[:EXTRA ARGS] ...
#   GENS="1 18 64" (default) picks the generation counts.
#
# Each build keeps its indexes in OUT/NAME (built in the first round, reused after) and each
# run's results in OUT/res/NAME-G-ROUND.json; `summary.py OUT BASE` prints the warm p50s.
# Use a new OUT for new binaries: an index a build left in OUT/NAME is reused by whichever
# binary runs under that NAME next.
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 ROUNDS OUT NAME=BINARY[:EXTRA ARGS] NAME=BINARY[:EXTRA ARGS] ..." >&2
  exit 2
fi
rounds=$1; out=$2; shift 2
mkdir -p "$out/res"
specs=("$@")
n=${#specs[@]}
for r in $(seq 1 "$rounds"); do
  for g in ${GENS:-1 18 64}; do
    for i in $(seq 0 $((n - 1))); do
      spec=${specs[$(((i + r) % n))]}
      name=${spec%%=*}; rest=${spec#*=}
      bin=${rest%%:*}; extra=""
      [[ "$rest" == *:* ]] && extra=${rest#*:}
      # No result of an earlier run in OUT may stand in for a failed one.
      rm -f "$out/res/$name-$g-$r.json"
      # shellcheck disable=SC2086 # the extra arguments are words
      if ! "$bin" bench generations --gens "$g" --reuse --cold-queries 1 --out "$out/$name" $extra \
        > "$out/res/$name-$g-$r.log" 2>&1; then
        echo "failed: $name at G = $g, round $r (see $out/res/$name-$g-$r.log)" >&2
        continue
      fi
      cp "$out/$name/results.json" "$out/res/$name-$g-$r.json"
    done
  done
  echo "round $r of $rounds done $(date +%T)"
done
