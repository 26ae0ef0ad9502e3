"""redis-py is the optional extra ``chronoq[redis]``: the base never imports it, and
asking for a Redis broker without it says which ``pip install`` line adds it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import python_without

#: Runs with ``redis`` unimportable (:func:`python_without`) and prints what it saw as JSON.
CHILD = r"""
import json
import sys

from broker_adapter import open_broker
from broker_adapter.errors import MissingExtra

seen = {}
broker = open_broker("rocksdb://" + sys.argv[1])
broker.close()
seen["redis_imported_by_the_base"] = "redis" in sys.modules
for how in ("open_broker", "import"):
    try:
        if how == "open_broker":
            open_broker("redis://127.0.0.1:1/0")
        else:
            from broker_adapter.redis import RedisBroker  # noqa: F401
    except MissingExtra as e:
        seen[how] = [e.extra, str(e)]
    except BaseException as e:
        seen[how] = ["other", repr(e)]
print(json.dumps(seen))
"""


def test_a_missing_redis_extra_is_a_missing_extra_naming_the_pip_line(tmp_path: Path) -> None:
    # Given: a process in which redis-py cannot be imported
    out = python_without("redis", CHILD, str(tmp_path / "db"))
    seen = json.loads(out.splitlines()[-1])
    # Then: the embedded broker works without it, and a Redis broker names the extra
    assert seen["redis_imported_by_the_base"] is False
    for how in ("open_broker", "import"):
        extra, text = seen[how]
        assert extra == "redis", seen
        assert "pip install 'chronoq[redis]'" in text and "the Redis broker" in text
