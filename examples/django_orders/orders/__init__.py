"""The orders app: models, views, the auto-close job and ``manage.py chronoq_run``."""
