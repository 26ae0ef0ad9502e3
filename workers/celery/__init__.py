"""chronoq on Celery: due jobs published to real Celery workers (``chronoq[celery]``).

Everything Celery-specific lives in this package, which only a program that uses
Celery imports (``import workers`` and ``chronoq run`` never do):

- :mod:`~workers.celery.app`: :func:`celery_app_for` (a ready Celery app),
  :func:`install` (an existing one), the generic task, :func:`schedule_task`;
- :mod:`~workers.celery.executor`: :class:`CeleryExecutor`, which publishes due
  jobs and waits for their outcomes; its publisher thread
  (:mod:`~workers.celery.publisher`, :mod:`~workers.celery.batching`) publishes
  on the script path (:mod:`~workers.celery.atomic`) or kombu's
  (:mod:`~workers.celery.publish`), and :mod:`~workers.celery.results` reads the
  outcomes;
- :mod:`~workers.celery.redis_transport` and :mod:`~workers.celery.redis_backend`:
  kombu's Redis transport and Celery's Redis result backend, cheaper per task;
- :mod:`~workers.celery.compat`: the one place that touches Celery's, kombu's and
  redis-py's private names.

:raises MissingExtra: on import, when Celery is not installed.
"""

from broker_adapter.extras import require

# Before anything imports celery: a missing extra says which pip line to run.
require("celery", "celery", "the Celery executor")

from workers.celery.app import (
    CELERY_URL_ENV,
    DEFAULT_CELERY_URL,
    celery_app_for,
    install,
    run_registered,
    schedule_task,
    scheduler_of,
    task_job,
)
from workers.celery.executor import CeleryExecutor
from workers.celery.publish import RUN_TASK, TASK_JOB_PREFIX
from workers.celery.redis_backend import BACKEND_PATH, RedisResultBackend
from workers.celery.redis_transport import TRANSPORT_PATH, RedisTransport

__all__ = [
    "BACKEND_PATH",
    "CELERY_URL_ENV",
    "DEFAULT_CELERY_URL",
    "RUN_TASK",
    "TASK_JOB_PREFIX",
    "TRANSPORT_PATH",
    "CeleryExecutor",
    "RedisResultBackend",
    "RedisTransport",
    "celery_app_for",
    "install",
    "run_registered",
    "schedule_task",
    "scheduler_of",
    "task_job",
]
