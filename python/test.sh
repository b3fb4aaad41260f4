#!/usr/bin/env bash
# Build the Python package into a virtualenv (target/python-venv, or $LSMSEARCH_VENV) and run
# its tests. Needs python3 (3.10 or later, with venv) and cargo; installs the rest with pip.
set -euo pipefail
cd "$(dirname "$0")"
venv="${LSMSEARCH_VENV:-$(cd .. && pwd)/target/python-venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements-test.txt
# A debug build shares the library's build with `cargo test`; pass --release for speed.
VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" maturin develop -q "$@"
"$venv/bin/python" -m pytest -q tests
