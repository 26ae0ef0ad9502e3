"""The Django project of the order service example: settings, URLs, WSGI entry point."""
