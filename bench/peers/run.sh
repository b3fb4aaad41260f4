#!/usr/bin/env bash
# Runs bench/peers/peers.py in its own virtualenv (created on first use from PyPI).
#
#   bash bench/peers/run.sh --docs 100000          # any peers.py arguments
#
# PEERS_VENV  the virtualenv to use or create (default: bench/peers/.venv)
# PYTHON      the interpreter that creates it (default: python3; 3.9 or newer)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

venv="${PEERS_VENV:-$here/.venv}"
python="${PYTHON:-python3}"
# The versions the benchmark was checked with.
pins=(lancedb==0.40.0 pylance==14.0.2 pyarrow==26.0.1 numpy==2.4.6)

if [ ! -x "$venv/bin/python" ]; then
    echo "creating the virtualenv $venv" >&2
    "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" - "${pins[@]}" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
sys.exit(any(version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
PY
    echo "installing ${pins[*]} into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    "$venv/bin/python" -m pip install --quiet "${pins[@]}" >&2
fi

# `run.sh ingest ...` runs the ingest comparison (ingest.py), `run.sh stream ...` queries while
# writes flow (stream.py); anything else, the query one (peers.py).
script=peers.py
case "${1:-}" in
    ingest) shift; script=ingest.py ;;
    stream) shift; script=stream.py ;;
esac
PEERS_LAUNCHER="bash bench/peers/run.sh" exec "$venv/bin/python" "$here/$script" "$@"
