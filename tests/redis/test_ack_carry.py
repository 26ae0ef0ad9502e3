"""What a pull's round trip carries of the queued acks (``AckBatcher.carried``): on a
cluster only the acks of the masters the trip calls anyway, so an ack of another
master never adds that master to the trip (issue 19)."""

from __future__ import annotations

import redis

from broker_adapter.redis.acks import AckBatcher
from broker_adapter.redis.keys import Keyspace
from broker_adapter.redis.scripts import Scripts


def test_a_trip_carries_only_the_acks_of_the_shards_it_names(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keyspace.build("cq", 4)
    scripts = Scripts(client)
    scripts.load()
    batcher = AckBatcher(scripts, keys)
    carried_some = 0
    try:
        for round_ in range(20):
            for s in range(4):
                batcher.add(s, "g", b"%d" % (round_ * 4 + s), b"1:1")
            # the batcher's own thread may write them first (then nothing is carried)
            with batcher.carried("g", {0, 1}) as step:
                if step is not None:
                    carried_some += 1
                    assert set(step[1]) <= {0, 1}, step[1]
            batcher.flush()  # the rest is written by the batcher, as after any trip
    finally:
        batcher.close()
        client.close()
    assert carried_some > 0
