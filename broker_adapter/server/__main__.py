"""``python -m broker_adapter.server``: see :mod:`broker_adapter.server.cli`."""

import sys

from broker_adapter.server.cli import main

sys.exit(main())
