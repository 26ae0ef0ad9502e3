"""Spark settings: one frozen :class:`SparkSettings`, read from ``CHRONOQ_SPARK_*`` variables.

The ``spark`` executor kind owns the ``CHRONOQ_SPARK_*`` variables (see
:mod:`scheduler.executor_kinds`); :class:`scheduler.settings.Settings` leaves them
to this module.

==========================  ==========  ================================
variable                    field       default
==========================  ==========  ================================
``CHRONOQ_SPARK_MASTER``    ``master``  unset (``local[*]`` when needed)
==========================  ==========  ================================

An empty variable counts as unset. Extra ``spark.*`` configuration comes from
``SPARK_CONF`` (see :mod:`spark_tasks.session`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from scheduler.errors import InvalidSettings
from scheduler.settings import read_env

ENV_PREFIX = "CHRONOQ_SPARK_"


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """Where Spark jobs run, validated.

    :param master: the Spark master URL for ``executor="spark"`` jobs (``spark://...``,
        ``yarn``, ``k8s://...``); ``None`` means ``local[*]``.
    :raises InvalidSettings: for a value of the wrong type or an empty one.
    """

    master: str | None = None

    def __post_init__(self) -> None:
        master = self.master
        if master is not None and (not isinstance(master, str) or not master):
            raise InvalidSettings(
                "master", _env_name("master"), master, "must be a non-empty str, or None for unset"
            )

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """Map each field to the environment variable that sets it."""
        return {f.name: _env_name(f.name) for f in dataclasses.fields(cls)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """Build settings from ``CHRONOQ_SPARK_*`` variables, then apply ``overrides``.

        Unknown ``CHRONOQ_SPARK_*`` variables are logged as a warning (with the
        closest known name).

        :param environ: the variables to read; ``os.environ`` by default.
        :param overrides: field values that win over the environment.
        :raises InvalidSettings: for an unknown override name or an invalid value.
        """
        values = read_env(
            cls.env_names(),
            os.environ if environ is None else environ,
            overrides,
            prefix=ENV_PREFIX,
            what="Spark setting",
        )
        return cls(**values)


__all__ = ["ENV_PREFIX", "SparkSettings"]
