"""The embedded broker: timed messages on a RocksDB timing wheel, in process."""

from broker_adapter.embedded.broker import EmbeddedBroker
from broker_adapter.embedded.rocks_options import DURABILITY_MODES

__all__ = ["DURABILITY_MODES", "EmbeddedBroker"]
