"""The Redis adapter: the broker contract on Redis or Redis Cluster (many machines)."""

from broker_adapter.redis.broker import RedisBroker

__all__ = ["RedisBroker"]
