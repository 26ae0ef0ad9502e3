"""prometheus_client is the optional extra ``chronoq[metrics]``: a server without
``--metrics-port`` never imports it, and asking for metrics without it says which
``pip install`` line adds it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import python_without

#: Runs with ``prometheus_client`` unimportable (:func:`python_without`) and prints
#: what it saw as JSON.
CHILD = r"""
import json
import sys

from broker_adapter.errors import MissingExtra
from broker_adapter.server.server import BrokerServer

seen = {}
server = BrokerServer(sys.argv[1], port=0)
server.start()
try:
    server.metrics.serve(0)
except MissingExtra as e:
    seen["serve"] = [e.extra, str(e)]
except BaseException as e:
    seen["serve"] = ["other", repr(e)]
finally:
    server.shutdown()
seen["imported"] = "prometheus_client" in sys.modules
print(json.dumps(seen))
"""


def test_metrics_without_the_extra_are_a_missing_extra_naming_the_pip_line(
    tmp_path: Path,
) -> None:
    # Given: a server process in which prometheus_client cannot be imported
    out = python_without("prometheus_client", CHILD, str(tmp_path / "data"))
    seen = json.loads(out.splitlines()[-1])
    # Then: it serves without metrics; asking for them names the extra
    assert seen["imported"] is False
    extra, text = seen["serve"]
    assert extra == "metrics", seen
    assert "pip install 'chronoq[metrics]'" in text and "metrics endpoint" in text
