"""The Redis adapter: the broker contract on Redis or Redis Cluster (many machines).

redis-py comes with the ``chronoq[redis]`` extra; without it, importing this
package (which ``open_broker("redis://...")`` does) raises
:class:`~broker_adapter.errors.MissingExtra` naming the ``pip install`` line.
"""

from broker_adapter.extras import require

require("redis", "redis", "the Redis broker")  # before any module here imports redis

from broker_adapter.redis.broker import RedisBroker
from broker_adapter.redis.keys import Keyspace

__all__ = ["Keyspace", "RedisBroker"]
