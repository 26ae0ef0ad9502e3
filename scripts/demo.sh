#!/usr/bin/env bash
# Set up and run chronoq's main job on the embedded default broker.
set -euo pipefail
cd "$(dirname "$0")/.."
CHRONOQ_SKIP_APT=1 bash scripts/setup.sh
exec .venv/bin/python examples/broker_demo.py "$@"
