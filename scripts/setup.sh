#!/usr/bin/env bash
# Set up a fresh machine for chronoq: a venv with chronoq and its dev tools,
# and redis-server when it is missing (tests start their own on a free port).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python -c "import broker_adapter, rocksdict, croniter, celery, pyspark, pytest, hypothesis" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.chronoq-installed ]; then
    .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "import broker_adapter, rocksdict, croniter, pytest" # fail loudly if the install failed
    touch .venv/.chronoq-installed
fi
if [ "${CHRONOQ_SKIP_APT:-}" != "1" ] && ! command -v redis-server >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
        $SUDO apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
    else
        echo "redis-server is missing and apt-get is not available: install it by hand" >&2
    fi
fi
