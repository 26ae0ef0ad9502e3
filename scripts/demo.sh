#!/usr/bin/env bash
# Set up and run chronoq's main job on the embedded default broker:
# `chronoq run examples.order_timeout:app`, a shop whose unpaid orders are closed
# by timed jobs (exits by itself in about six seconds). Extra arguments go to
# `chronoq run` (e.g. --log-level WARNING).
set -euo pipefail
cd "$(dirname "$0")/.."
CHRONOQ_SKIP_APT=1 bash scripts/setup.sh
exec .venv/bin/chronoq run examples.order_timeout:app "$@"
