"""The WSGI entry point (``gunicorn orders_site.wsgi -w 4``: each worker opens the
same ``rocksdb://`` directory; the first owns it, the others are its clients)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orders_site.settings")
application = get_wsgi_application()
