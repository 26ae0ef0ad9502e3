"""A dispatcher process for the multi-process Redis tests (run as a script).

``dispatch_child.py URL OUT GROUP[,GROUP...] TOPIC [--hold-s S] [--invisible-ms MS]``:
one RedisBroker (which also fires), one consumer per group on TOPIC; each pulled
message is journalled to OUT as ``got <group> <msg_id> <attempts>``, then (after
``--hold-s`` seconds, to be killed mid-batch) acked and journalled as
``ack <group> <msg_id> <attempts>``. Runs until ``OUT.stop`` exists (bounded: 120 s).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from broker_adapter.redis import RedisBroker


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("out")
    p.add_argument("groups")
    p.add_argument("topic")
    p.add_argument("--hold-s", type=float, default=0.0)
    p.add_argument("--invisible-ms", type=int, default=60_000)
    args = p.parse_args()
    stop = args.out + ".stop"
    broker = RedisBroker.from_url(args.url)
    consumers = [
        broker.consumer(g, [args.topic], invisible_ms=args.invisible_ms)
        for g in args.groups.split(",")
    ]
    deadline = time.monotonic() + 120
    with open(args.out, "a", buffering=1) as out:
        out.write("ready\n")
        while not os.path.exists(stop) and time.monotonic() < deadline:
            for c in consumers:
                got = c.pull(max_messages=50, wait_ms=50)
                out.writelines(f"got {c.group} {m.msg_id} {m.attempts}\n" for m in got)
                if got and args.hold_s:
                    time.sleep(args.hold_s)
                for m in got:
                    if c.ack(m):
                        out.write(f"ack {c.group} {m.msg_id} {m.attempts}\n")
    for c in consumers:
        c.close()
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
