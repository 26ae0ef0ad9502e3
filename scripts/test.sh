#!/usr/bin/env bash
# Set up (scripts/setup.sh all) and check everything: ruff check, ruff format --check,
# mypy (strict) and the default test suite. Extra arguments go to pytest.
# Exits non-zero when a check finds something, a test fails, or no test ran.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh all || exit 1
failed=()
.venv/bin/ruff check . || failed+=("ruff check")
.venv/bin/ruff format --check . || failed+=("ruff format --check")
.venv/bin/mypy || failed+=("mypy")
.venv/bin/python -m pytest -q --durations=15 "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "no test ran: failing" >&2
    failed+=("pytest (no test ran)")
elif [ "$status" -ne 0 ]; then
    failed+=("pytest")
fi
if [ "${#failed[@]}" -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
