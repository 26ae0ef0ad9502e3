"""Settings of the order service: SQLite for the orders, chronoq for the auto-close.

Environment:

* ``ORDERS_DATA_DIR``: where the SQLite file lives (default ``./orders-data``
  beside ``manage.py``);
* ``CHRONOQ_BROKER_URL``: the broker (default ``rocksdb://$ORDERS_DATA_DIR/chronoq``);
  every process (the web server's workers, ``manage.py chronoq_run``) opens the
  same ``rocksdb://`` directory: the first owns it, the others become its clients;
* ``ORDERS_CLOSE_AFTER_S``: seconds from an order's creation to its auto-close
  (default 1800);
* ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG=1``: as usual.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("ORDERS_DATA_DIR") or BASE_DIR / "orders-data")
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or "django-insecure-example-only"
DEBUG = os.environ.get("DJANGO_DEBUG") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

# A JSON API only: no admin, sessions or templates (and so no CSRF middleware).
INSTALLED_APPS = ["orders.apps.OrdersConfig"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "orders_site.urls"
WSGI_APPLICATION = "orders_site.wsgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "orders.sqlite3",
        # The web server and the dispatcher write from different processes: wait for
        # each other's short transactions (WAL mode is set in orders.apps).
        "OPTIONS": {"timeout": 30},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

#: chronoq: the broker URL, the app ``manage.py chronoq_run`` runs, the auto-close delay.
CHRONOQ_BROKER_URL = os.environ.get("CHRONOQ_BROKER_URL") or f"rocksdb://{DATA_DIR / 'chronoq'}"
CHRONOQ_APP = "orders.jobs:app"
ORDERS_CLOSE_AFTER_S = float(os.environ.get("ORDERS_CLOSE_AFTER_S") or 30 * 60)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "chronoq": {"handlers": ["console"], "level": "INFO"},
        "orders": {"handlers": ["console"], "level": "INFO"},
    },
}
