"""The options of a shared ``rocksdb://DIR`` (see :mod:`broker_adapter.shared.broker`),
read from the URL's query or, for some, from the environment.

* ``share=0|1`` (``CHRONOQ_SHARE``): sharing on (the default) or off.
* ``share_timeout_ms=N``: how long an opener waits for an owner that holds the lock
  but does not answer yet (10,000).
* ``handover_drain_ms=N`` (``CHRONOQ_HANDOVER_DRAIN_MS``): how long a closing owner
  waits for its clients to settle the messages they pulled (10,000; 0: no wait).

The URL wins over the environment.
"""

from __future__ import annotations

import os

from broker_adapter.errors import InvalidArgument

DEFAULT_SHARE_TIMEOUT_MS = 10_000
DEFAULT_HANDOVER_DRAIN_MS = 10_000
SHARE_ENV = "CHRONOQ_SHARE"
HANDOVER_DRAIN_ENV = "CHRONOQ_HANDOVER_DRAIN_MS"


def share_enabled(params: dict[str, str]) -> bool:
    """Whether ``share`` (popped from ``params``) or ``CHRONOQ_SHARE`` turns sharing on.

    :raises InvalidArgument: for a value that is not 0/1/true/false/yes/no/on/off.
    """
    value = params.pop("share", None)
    if value is None:
        value = os.environ.get(SHARE_ENV) or "1"
    flag = {"1": True, "true": True, "yes": True, "on": True}.get(value.strip().lower())
    if flag is None and value.strip().lower() not in ("0", "false", "no", "off"):
        raise InvalidArgument(f"share={value!r}: use share=1 (the default) or share=0")
    return bool(flag)


def ms_option(params: dict[str, str], name: str, env: str | None = None) -> int | None:
    """The milliseconds ``name`` (popped from ``params``) or the variable ``env`` gives,
    ``None`` when neither does.

    :raises InvalidArgument: for a value that is not a whole number >= 0.
    """
    value = params.pop(name, None)
    if value is None and env is not None:
        value = os.environ.get(env) or None
    if value is None:
        return None
    try:
        ms = int(value)
    except ValueError:
        ms = -1
    if ms < 0:
        where = name if env is None else f"{name} (or {env})"
        raise InvalidArgument(f"{where}={value!r}: give a whole number of milliseconds >= 0")
    return ms


__all__ = [
    "DEFAULT_HANDOVER_DRAIN_MS",
    "DEFAULT_SHARE_TIMEOUT_MS",
    "HANDOVER_DRAIN_ENV",
    "SHARE_ENV",
    "ms_option",
    "share_enabled",
]
