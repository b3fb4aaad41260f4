#!/usr/bin/env bash
# Every test: the Rust suite, then the Python package's (python/test.sh).
set -euo pipefail
cd "$(dirname "$0")"
cargo test
bash python/test.sh
