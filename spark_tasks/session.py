"""One shared :class:`~pyspark.sql.SparkSession` per worker process: :func:`get_spark`.

The session is created on first use (never at import: ``import spark_tasks`` does
not import pyspark; without the ``spark`` extra, the first use raises
:class:`~broker_adapter.errors.MissingExtra`) and stopped by :func:`stop_spark`, which the Spark
dispatcher calls on shutdown (and an ``atexit`` hook calls otherwise).

Configuration, first match wins:

==========================  ==============================================================
what                        from
==========================  ==============================================================
master                      ``master=`` argument, ``SparkSettings.master``
                            (``CHRONOQ_SPARK_MASTER``, :mod:`spark_tasks.settings`),
                            else ``local[*]``
app name                    ``app_name=`` argument, else ``chronoq``
extra ``spark.*`` conf      ``conf=`` argument, then ``SPARK_CONF`` (comma- or
                            newline-separated ``spark.key=value`` pairs), then
                            :data:`DEFAULT_CONF`
==========================  ==============================================================

``local[...]`` masters, and cluster masters on this machine's loopback
(``spark://127.0.0.1:7077``, ``spark://localhost:7077``: :func:`is_loopback_master`),
also get :data:`LOOPBACK_CONF` (driver bound to 127.0.0.1, so nothing listens on
other interfaces, and executors of a loopback cluster reach the driver there),
and ``PYSPARK_PYTHON`` is set to the running interpreter unless already set, so
Python workers use this venv (on a cluster, the executors' machines need the
same path).

A Spark standalone cluster (``spark://``; the tests run a real one from the pip
pyspark installation, ``tests/spark/standalone.py``), YARN or Kubernetes::

    CHRONOQ_SPARK_MASTER=spark://spark-master:7077 chronoq worker --executor spark shop.jobs:app
    CHRONOQ_SPARK_MASTER=yarn SPARK_CONF="spark.executor.instances=4" chronoq worker ...

or run the Spark worker under ``spark-submit`` (which then owns master and conf;
the session here picks up the submitted ones, since ``getOrCreate`` reuses the
context spark-submit configured)::

    spark-submit --master yarn --deploy-mode client \\
        --conf spark.executor.memory=4g \\
        "$(python -c 'import workers.cli as c; print(c.__file__)')" \\
        worker --executor spark shop.jobs:app

The broker URL must then be reachable from the driver (``chronoq://host:7420``
of ``chronoq broker serve``, or ``redis://``): an embedded ``rocksdb://``
directory belongs to one process.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from broker_adapter.extras import require
from spark_tasks.settings import SparkSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_log = logging.getLogger("chronoq.spark_tasks.session")

DEFAULT_MASTER = "local[*]"
DEFAULT_APP_NAME = "chronoq"
#: Environment variable with extra ``spark.*`` settings (``k=v`` pairs).
CONF_ENV = "SPARK_CONF"
#: Keeps a local driver on loopback (see ``../shared/NOTES.md``).
LOOPBACK_CONF: Mapping[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}
#: Sensible defaults for a scheduler's short jobs (any can be overridden).
DEFAULT_CONF: Mapping[str, str] = {
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}

_lock = threading.Lock()
_session: SparkSession | None = None


def parse_conf(text: str) -> dict[str, str]:
    """``{"spark.a": "1", ...}`` from ``"spark.a=1, spark.b=x"`` (commas or newlines).

    :raises ValueError: for a pair without ``=`` or a key not starting with ``spark.``.
    """
    out: dict[str, str] = {}
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key.startswith("spark."):
            raise ValueError(f"{CONF_ENV}: expected spark.key=value pairs, got {part!r}")
        out[key] = value.strip()
    return out


def is_loopback_master(master: str) -> bool:
    """Whether ``master`` runs the driver on this machine's loopback: ``local[...]``,
    or a ``spark://`` master at 127.0.0.1 / localhost (every host of the URL, for a
    ``spark://h1:7077,h2:7077`` standby list)."""
    if master.startswith("local"):
        return True
    if not master.startswith("spark://"):
        return False
    hosts = [h.strip().rpartition(":")[0] or h.strip() for h in master[8:].split(",")]
    return all(h in ("127.0.0.1", "localhost") for h in hosts)


def session_conf(
    master: str,
    conf: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The ``spark.*`` settings a session for ``master`` gets (see the module docstring)."""
    env = os.environ if environ is None else environ
    merged = dict(DEFAULT_CONF)
    if is_loopback_master(master):
        merged.update(LOOPBACK_CONF)
    merged.update(parse_conf(env.get(CONF_ENV, "")))
    merged.update(conf or {})
    return merged


def get_spark(
    settings: SparkSettings | None = None,
    *,
    master: str | None = None,
    app_name: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The process's shared SparkSession, created on the first call.

    Later calls return the same session and ignore their arguments (a session's
    master cannot change while it runs; call :func:`stop_spark` first).

    :param settings: where the master comes from; ``SparkSettings.from_env()`` if
        neither it nor ``master`` is given.
    :param master: the Spark master URL; wins over the settings.
    :param app_name: the application name shown by Spark.
    :param conf: extra ``spark.*`` settings; win over ``SPARK_CONF``.
    :raises MissingExtra: without pyspark (``pip install chronoq[spark]``).
    """
    global _session
    session = _session
    if session is not None:
        return session
    with _lock:
        if _session is not None:
            return _session
        if master is None:
            if settings is None:
                settings = SparkSettings.from_env()
            master = settings.master or DEFAULT_MASTER
        sql = require("pyspark.sql", "spark", "Spark jobs and pipelines")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if is_loopback_master(master):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder: Any = sql.SparkSession.builder.master(master).appName(app_name or DEFAULT_APP_NAME)
        for key, value in session_conf(master, conf).items():
            builder = builder.config(key, value)
        _log.info("starting SparkSession (master %s)", master)
        _session = builder.getOrCreate()
        atexit.register(stop_spark)
        return _session


def active_spark() -> SparkSession | None:
    """The shared session if it was started (and not stopped), else ``None``."""
    return _session


def stop_spark() -> None:
    """Stop the shared session if one runs; harmless otherwise."""
    global _session
    with _lock:
        session, _session = _session, None
    if session is not None:
        _log.info("stopping SparkSession")
        session.stop()


__all__ = [
    "CONF_ENV",
    "DEFAULT_CONF",
    "DEFAULT_MASTER",
    "LOOPBACK_CONF",
    "active_spark",
    "get_spark",
    "is_loopback_master",
    "parse_conf",
    "session_conf",
    "stop_spark",
]
