#!/usr/bin/env bash
# Set up and run chronoq's main job on the embedded default broker:
# `chronoq run examples.order_timeout:app`, a shop whose unpaid orders are closed
# by timed jobs (exits by itself in about six seconds). Extra arguments go to
# `chronoq run` (e.g. --log-level WARNING).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh base
exec .venv/bin/chronoq run examples.order_timeout:app "$@"
