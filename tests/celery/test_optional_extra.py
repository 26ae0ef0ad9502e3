"""Celery is the optional extra ``chronoq[celery]``: the base path never imports it,
and asking for the Celery integration without it names the pip line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import python_without

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_the_base_path_imports_no_celery_kombu_or_redis() -> None:
    code = (
        "import sys, scheduler, workers, workers.cli, workers.dispatcher, workers.runner,"
        " workers.executors.factory; print(sorted({m.partition('.')[0] for m in sys.modules}"
        " & {'celery', 'kombu', 'redis'}))"
    )
    assert _python(code) == "[]"


def test_the_celery_integration_without_celery_raises_missing_extra() -> None:
    code = (
        "import workers, workers.cli\n"  # the base path is fine without it
        "from broker_adapter.errors import ChronoqError, MissingExtra\n"
        "try:\n"
        "    from workers.celery import celery_app_for\n"
        "except MissingExtra as e:\n"
        "    print(isinstance(e, ChronoqError), e.extra, '|', e)\n"
    )
    assert python_without("celery", code) == (
        "True celery | the Celery executor needs chronoq's 'celery' extra, which is not "
        "installed: pip install 'chronoq[celery]'"
    )
