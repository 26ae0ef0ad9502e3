"""A tour of the embedded broker: timed messages, abort messages, a consumer group.

A shop creates ten orders; each gets an auto-close message due a few seconds
later, keyed ``order:<id>``. Four orders are paid in time, so their close
messages are aborted by key. A consumer group receives the six that fire and
prints how late each was. Run with ``bash scripts/demo.sh`` (or
``python examples/broker_demo.py``); it exits by itself in about five seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time

from broker_adapter import AbortStatus, Message, open_broker

URL = os.environ.get("CHRONOQ_BROKER_URL", "rocksdb://./chronoq-data")


def main() -> int:
    with open_broker(URL) as broker:
        orders = list(range(1, 11))
        for order_id in orders:
            body = json.dumps({"order_id": order_id}).encode()
            res = broker.send(
                Message(
                    "orders.close", body, key=f"order:{order_id}", delay_ms=2000 + 200 * order_id
                )
            )
            print(
                f"order {order_id:2d} created; auto-close {res.msg_id} due in "
                f"{(res.deliver_at_ms - time.time() * 1000) / 1000:.1f} s"
            )
        paid = {2, 5, 7, 9}
        for order_id in sorted(paid):
            ab = broker.abort(key=f"order:{order_id}", topic="orders.close")
            print(f"order {order_id:2d} paid; auto-close {ab.status.value}")
            assert ab.status is AbortStatus.ABORTED
        closed: list[int] = []
        with broker.consumer("shop", ["orders.close"]) as consumer:
            deadline = time.time() + 15
            while len(closed) < len(orders) - len(paid) and time.time() < deadline:
                for m in consumer.pull(max_messages=16, wait_ms=500):
                    order_id = json.loads(m.body)["order_id"]
                    late = time.time() * 1000 - m.deliver_at_ms
                    print(f"order {order_id:2d} closed (unpaid), fired {late:.1f} ms after due")
                    closed.append(order_id)
                    consumer.ack(m)
        stats = broker.stats()
        print(
            f"closed {sorted(closed)}, paid {sorted(paid)}; broker: "
            f"{stats.pending} pending, {stats.fired_total} fired in total"
        )
        return 0 if sorted(closed) == sorted(set(orders) - paid) else 1


if __name__ == "__main__":
    sys.exit(main())
