#!/usr/bin/env bash
# Set up a fresh machine for chronoq in .venv.
#
#   bash scripts/setup.sh base   # chronoq alone (pip install -e .): the embedded broker,
#                                # the scheduler and `chronoq run`; what the demo needs
#   bash scripts/setup.sh all    # every extra and the dev tools (pip install -e '.[all,dev]'),
#                                # and redis-server, chromium and chromium-driver when
#                                # missing (the tests start their own); what the tests need
#
# Installs only what is missing or older than pyproject.toml; CHRONOQ_SKIP_APT=1 skips apt.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-all}"
case "$profile" in
    base) spec="."; check="import broker_adapter, scheduler, workers, rocksdict, croniter, msgpack" ;;
    all) spec=".[all,dev]"; check="import broker_adapter, rocksdict, croniter, celery, pyspark, redis, matplotlib, prometheus_client, fastapi, uvicorn, django, httpx, selenium, pytest, hypothesis, mypy, ruff" ;;
    *) echo "usage: scripts/setup.sh [base|all]" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
marker=".venv/.chronoq-installed-$profile"
if ! .venv/bin/python -c "$check" 2>/dev/null || [ ! -f "$marker" ] || [ pyproject.toml -nt "$marker" ]; then
    .venv/bin/pip install -q --disable-pip-version-check -e "$spec" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c "$check" # fail loudly if the install failed
    touch "$marker"
fi
# The tests' system packages: redis-server (started by the tests on a free port) and
# Debian's Chromium with its driver (the dashboard's browser tests drive it headless).
missing=()
if [ "$profile" = "all" ] && [ "${CHRONOQ_SKIP_APT:-}" != "1" ]; then
    command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
    command -v ip >/dev/null 2>&1 || missing+=(iproute2) # tests/netns: ip netns, veth, bridge
fi
if [ "${#missing[@]}" -gt 0 ]; then
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
        $SUDO apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "missing ${missing[*]} and apt-get is not available: install them by hand" >&2
    fi
fi
