#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole default test suite.
# Extra arguments go to pytest. Exits non-zero when a test fails or none ran.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest -q "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "no test ran: failing" >&2
    exit 1
fi
exit "$status"
