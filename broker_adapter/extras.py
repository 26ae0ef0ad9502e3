"""Optional parts of chronoq: import a third-party module that an extra installs.

The base install (``pip install chronoq``) is what the embedded broker, the
scheduler and ``chronoq run`` need. Celery, PySpark, redis-py, matplotlib,
prometheus_client, and FastAPI, uvicorn and Django (for the web app examples;
the core never imports them) come with extras; a feature that needs one imports
it through :func:`require`, so a missing extra is a :class:`~broker_adapter.errors.MissingExtra`
naming the ``pip install`` line, not a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from broker_adapter.errors import MissingExtra

#: Each extra of ``pyproject.toml`` and the top-level third-party modules it installs.
EXTRAS: dict[str, tuple[str, ...]] = {
    "redis": ("redis",),
    "celery": ("celery", "kombu", "redis"),
    "spark": ("pyspark",),
    "report": ("matplotlib",),
    "metrics": ("prometheus_client",),
    "fastapi": ("fastapi", "uvicorn"),
    "dashboard": ("fastapi", "uvicorn"),
    "django": ("django",),
}


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` (a third-party module of ``extra``), or say how to install it.

    :param module: the dotted module name, e.g. ``"celery"`` or ``"pyspark.sql"``.
    :param extra: the chronoq extra that installs it (a key of :data:`EXTRAS`).
    :param feature: what needs it, in words (``"the Celery executor"``).
    :raises MissingExtra: when the module (or one it needs) is not installed.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        top = (e.name or module).partition(".")[0]
        if top not in EXTRAS.get(extra, ()) and top != module.partition(".")[0]:
            raise  # a broken install of something else: not a missing extra
        raise MissingExtra(extra, feature) from e


__all__ = ["EXTRAS", "require"]
