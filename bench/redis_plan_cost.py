"""CPU per message of ``plan_send`` (cutting a send batch into ``send.lua`` groups),
no Redis: one instance's single shard, a 3-master cluster's 12 shards placed by due
slice, and the same 12 shards spread evenly, in alternating rounds (issue 19 §3:
what the due-slice placement adds to a cluster's batched sends on the client).

Each round plans ``--batches`` batches of 1,000 keyless messages due uniformly over
10 s, with the slice counts kept across batches as a broker keeps them; the messages
are frozen out of the garbage collector first. Compare within one run: the figures
move by up to ~2x between runs on this shared VM.

Run from the project root::

    .venv/bin/python bench/redis_plan_cost.py --rounds 4
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
from collections.abc import Sequence

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.stats import load_average, print_block
from broker_adapter.message import Message
from broker_adapter.redis import keys as K
from broker_adapter.redis.client_calls import KEYLESS_SLICE_MS, plan_send

#: 12 shards on 3 masters, as ``Scripts.by_node`` groups a fresh 3-master cluster's.
MASTERS = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batches", type=int, default=50)
    args = p.parse_args(argv)
    one, twelve = K.Keyspace.build("cq", 1), K.Keyspace.build("cq", 12)
    now = int(time.time() * 1000)
    rng = random.Random(1)
    batches = [
        [
            Message("bench", b"x" * 100, deliver_at_ms=now + 4000 + rng.randrange(10_000))
            for _ in range(1000)
        ]
        for _ in range(args.batches)
    ]
    setups = (
        ("one instance, 1 shard", one, None),
        ("cluster, 12 shards by due slice", twelve, MASTERS),
        ("cluster, 12 shards spread evenly", twelve, None),
    )
    rows: dict[str, list[float]] = {name: [] for name, _k, _m in setups}
    n = 1000 * args.batches
    gc.collect()
    gc.freeze()  # the batches' 50k messages: no full collection inside a timed round
    for _ in range(args.rounds):
        for name, keys, masters in setups:
            placed: dict[int, int] = {}
            c0 = time.process_time()
            for i, batch in enumerate(batches):
                plan_send(
                    batch, keys, now, 10**12, i % keys.shards, masters, KEYLESS_SLICE_MS, placed
                )
            rows[name].append((time.process_time() - c0) / n * 1e6)
    print_block(
        "redis_plan_cost: plan_send CPU per message (us), each round",
        [("load", load_average())]
        + [(name, " ".join(f"{v:.2f}" for v in vals)) for name, vals in rows.items()],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
