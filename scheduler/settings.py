"""Scheduler settings: one frozen :class:`Settings`, read from ``CHRONOQ_*`` variables.

Every field has a safe default and an environment variable; constructor
arguments (or ``from_env`` overrides) win over the environment. Values are
checked at construction, so a bad setting fails at start-up with a message that
names both the field and its variable.

==============================  ===================  ===============================
variable                        field                default
==============================  ===================  ===============================
``CHRONOQ_BROKER_URL``          ``broker_url``       ``rocksdb://./chronoq-data``
``CHRONOQ_TOPIC``               ``topic``            ``chronoq.jobs``
``CHRONOQ_GROUP``               ``group``            ``chronoq.workers``
``CHRONOQ_MAX_WORKERS``         ``max_workers``      ``8``
``CHRONOQ_PREFETCH``            ``prefetch``         ``32``
``CHRONOQ_INLINE_JOBS``         ``inline_jobs``      ``true``
``CHRONOQ_PAST_TOLERANCE_MS``   ``past_tolerance_ms`` ``1000``
``CHRONOQ_LOG_LEVEL``           ``log_level``        ``INFO``
``CHRONOQ_TOKEN``               ``token``            unset (no authentication)
``CHRONOQ_METRICS_PORT``        ``metrics_port``     unset (no job metrics endpoint)
``CHRONOQ_METRICS_HOST``        ``metrics_host``     ``127.0.0.1``
==============================  ===================  ===============================

An empty variable counts as unset. Variables ``CHRONOQ_<KIND>_*`` of a registered
executor kind (:mod:`scheduler.executor_kinds`) belong to that kind's own settings,
e.g. ``CHRONOQ_SPARK_MASTER`` to :mod:`spark_tasks.settings`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from broker_adapter.checks import is_int
from broker_adapter.errors import InvalidArgument, InvalidTopic
from broker_adapter.message import check_topic
from broker_adapter.urls import ADAPTERS, split_url
from scheduler.errors import InvalidSettings
from scheduler.executor_kinds import EXECUTOR_KINDS

ENV_PREFIX = "CHRONOQ_"
DEFAULT_BROKER_URL = "rocksdb://./chronoq-data"
DEFAULT_TOPIC = "chronoq.jobs"
DEFAULT_GROUP = "chronoq.workers"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Upper bounds that catch typos (``CHRONOQ_MAX_WORKERS=80000``) rather than real limits.
MAX_WORKERS_LIMIT = 4096
MAX_PREFETCH = 100_000
MAX_PAST_TOLERANCE_MS = 24 * 3600 * 1000
#: A consumer group's dead-letter topic is ``%DLQ%<group>`` (at most 120 characters).
MAX_GROUP_CHARS = 120

_log = logging.getLogger("chronoq.scheduler.Settings")


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


#: Spellings a boolean variable may take (``CHRONOQ_INLINE_JOBS=0``).
_FLAGS = {"true": True, "1": True, "yes": True, "on": True}
_FLAGS.update({"false": False, "0": False, "no": False, "off": False})


def read_env(
    names: Mapping[str, str],
    environ: Mapping[str, str],
    overrides: Mapping[str, Any],
    *,
    prefix: str,
    skip_prefixes: tuple[str, ...] = (),
    int_fields: frozenset[str] = frozenset(),
    bool_fields: frozenset[str] = frozenset(),
    what: str = "setting",
) -> dict[str, Any]:
    """The field values of a settings class: its variables from ``environ``, then
    ``overrides`` (shared by :class:`Settings` and each executor kind's settings).

    Empty variables count as unset. Unknown variables starting with ``prefix``
    (but not with one of ``skip_prefixes``, whose owners read them) are logged as a
    warning with the closest known name, since a typo would otherwise be silently
    ignored.

    :param names: each field and the variable that sets it.
    :param int_fields: fields whose variables must parse as whole numbers.
    :param bool_fields: fields whose variables must be one of ``true/false``,
        ``1/0``, ``yes/no``, ``on/off`` (any case).
    :param what: what a field is called in errors (``"Spark setting"``).
    :raises InvalidSettings: for an unknown override name or a variable of an
        ``int_fields`` or ``bool_fields`` field that does not parse.
    """
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        name = unknown[0]
        raise InvalidSettings(
            name,
            prefix + name.upper(),
            overrides[name],
            f"no such {what}; known {what}s: {', '.join(names)}",
        )
    by_env = {v: k for k, v in names.items()}
    for var in sorted(
        k
        for k in environ
        if k.startswith(prefix) and k not in by_env and not k.startswith(skip_prefixes)
    ):
        close = difflib.get_close_matches(var, list(by_env), n=1)
        _log.warning(
            "ignoring unknown environment variable %s%s",
            var,
            f" (did you mean {close[0]}?)" if close else "",
        )
    values: dict[str, Any] = {}
    for name, var in names.items():
        raw = environ.get(var)
        if raw is None or not raw.strip():
            continue
        raw = raw.strip()
        if name in int_fields:
            try:
                values[name] = int(raw)
            except ValueError:
                raise InvalidSettings(name, var, raw, "must be a whole number, e.g. 8") from None
        elif name in bool_fields:
            flag = _FLAGS.get(raw.lower())
            if flag is None:
                raise InvalidSettings(name, var, raw, "must be true or false (or 1/0, yes/no)")
            values[name] = flag
        else:
            values[name] = raw
    values.update(overrides)
    return values


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a :class:`Scheduler` and its dispatcher need to know, validated.

    :param broker_url: the broker to open, see :func:`broker_adapter.open_broker`.
    :param topic: the topic jobs are sent to unless a job names its own.
    :param group: the consumer group of the dispatchers; its dead letters go to
        ``%DLQ%<group>``.
    :param max_workers: threads of the local executor's pool (1 to 4,096).
    :param prefetch: messages a dispatcher pulls at once (1 to 100,000).
    :param inline_jobs: a running dispatcher's pulling thread runs the short local jobs
        of a pull itself instead of handing them to a pool thread (see
        :mod:`workers.inline_runs`); ``False``: every job on the pool.
    :param past_tolerance_ms: how far in the past ``schedule(at=...)`` may be and
        still run at once; further back is an error (0 to one day).
    :param log_level: ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR`` or ``CRITICAL``
        (any case; stored upper case). Applied by the ``chronoq`` command only.
    :param token: shared secret for a ``chronoq://`` broker server; never shown in ``repr``.
        Also what scrapers of a job metrics endpoint off loopback must send.
    :param metrics_port: serve the dispatcher's job metrics (Prometheus) on this port
        (0: a free one), with ``chronoq run``/``worker`` or ``app.run()``; ``None``: off.
    :param metrics_host: the address the job metrics bind (a non-loopback one needs ``token``).
    :raises InvalidSettings: for any value of the wrong type or out of range.
    """

    broker_url: str = DEFAULT_BROKER_URL
    topic: str = DEFAULT_TOPIC
    group: str = DEFAULT_GROUP
    max_workers: int = 8
    prefetch: int = 32
    inline_jobs: bool = True
    past_tolerance_ms: int = 1000
    log_level: str = "INFO"
    token: str | None = field(default=None, repr=False)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self._check_broker_url()
        for name in ("topic", "group"):
            value = getattr(self, name)
            try:
                check_topic(value)
            except InvalidTopic as e:
                raise InvalidSettings(name, _env_name(name), value, str(e)) from None
        if len(self.group) > MAX_GROUP_CHARS:
            raise InvalidSettings(
                "group",
                _env_name("group"),
                self.group,
                f"a group name has at most {MAX_GROUP_CHARS} characters",
            )
        self._check_int("max_workers", 1, MAX_WORKERS_LIMIT)
        self._check_int("prefetch", 1, MAX_PREFETCH)
        self._check_int("past_tolerance_ms", 0, MAX_PAST_TOLERANCE_MS)
        if not isinstance(self.inline_jobs, bool):
            raise InvalidSettings(
                "inline_jobs", _env_name("inline_jobs"), self.inline_jobs, "must be True or False"
            )
        level = self.log_level
        if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
            raise InvalidSettings(
                "log_level", _env_name("log_level"), level, f"use one of {', '.join(LOG_LEVELS)}"
            )
        object.__setattr__(self, "log_level", level.upper())
        if self.metrics_port is not None:
            self._check_int("metrics_port", 0, 65535)
        if not isinstance(self.metrics_host, str) or not self.metrics_host:
            raise InvalidSettings(
                "metrics_host", _env_name("metrics_host"), self.metrics_host, "give an address"
            )
        token = self.token
        if token is not None and (not isinstance(token, str) or not token):
            raise InvalidSettings(
                "token",
                _env_name("token"),
                "<hidden>",
                "must be a non-empty str, or None for unset",
            )

    def _check_broker_url(self) -> None:
        url = self.broker_url
        env = _env_name("broker_url")
        try:
            scheme, rest, _ = split_url(url)
        except InvalidArgument:
            raise InvalidSettings(
                "broker_url",
                env,
                url,
                f"a broker URL looks like scheme://..., e.g. {DEFAULT_BROKER_URL}",
            ) from None
        if scheme not in ADAPTERS:
            raise InvalidSettings(
                "broker_url",
                env,
                url,
                f"unknown scheme {scheme!r}; use one of {', '.join(sorted(ADAPTERS))}",
            )
        if not rest:
            raise InvalidSettings(
                "broker_url",
                env,
                url,
                "the URL names no location; e.g. rocksdb://./chronoq-data or "
                "chronoq://127.0.0.1:7420",
            )

    def _check_int(self, name: str, low: int, high: int) -> None:
        value = getattr(self, name)
        if not is_int(value):
            raise InvalidSettings(name, _env_name(name), value, "must be an int")
        if not low <= value <= high:
            raise InvalidSettings(name, _env_name(name), value, f"must be between {low} and {high}")

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """Map each field to the environment variable that sets it."""
        return {f.name: _env_name(f.name) for f in dataclasses.fields(cls)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """Build settings from ``CHRONOQ_*`` variables, then apply ``overrides``.

        Unknown ``CHRONOQ_*`` variables are logged as a warning (with the closest
        known name), since a typo would otherwise be silently ignored; those of an
        executor kind (``CHRONOQ_<KIND>_*``) are left to the kind's settings.

        :param environ: the variables to read; ``os.environ`` by default.
        :param overrides: field values that win over the environment.
        :raises InvalidSettings: for an unknown override name, a variable that does
            not parse (``CHRONOQ_MAX_WORKERS=abc``), or any invalid value.
        """
        kind_prefixes = tuple(kind.env_prefix for kind in EXECUTOR_KINDS)
        values = read_env(
            cls.env_names(),
            os.environ if environ is None else environ,
            overrides,
            prefix=ENV_PREFIX,
            skip_prefixes=kind_prefixes,
            int_fields=frozenset({"max_workers", "prefetch", "past_tolerance_ms", "metrics_port"}),
            bool_fields=frozenset({"inline_jobs"}),
        )
        return cls(**values)
