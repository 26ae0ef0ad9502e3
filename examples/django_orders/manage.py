#!/usr/bin/env python
"""Django's command line for the order service (run it from this directory)::

python manage.py migrate                      # create the orders tables
python manage.py chronoq_run                  # the dispatcher: runs the auto-close jobs
python manage.py runserver 127.0.0.1:8000     # the web app (or any WSGI server)
"""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "orders_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
