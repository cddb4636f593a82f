"""faust's aiokafka transport with a short fetch wait, for the batcher.

aiokafka leaves a partition out of a fetch while records of it are still buffered (for more
than ``prefetch_backoff``, 100 ms), and faust asks the broker to hold each fetch up to 1.5 s
(``fetch_max_wait_ms``, fixed in faust). A batcher reads two one-partition topics from the same
broker: when the fetch in flight covers only ``batch-stats`` (requests still had unconsumed
records as it left, the batcher being busy), newly arrived requests wait until a stats record
comes or 1.5 s pass; with every request answered from the cache no stats come at all, and
requests stalled 1.5 s (seen in ``bench.cache``: the batcher's ``batcher_in`` stamp 1.6 s after
the selector's ``dispatched``). So: no fetch while a partition still has records to consume
(every fetch then covers both topics, and a record on either ends it), and the broker holds a
fetch 100 ms at most, like this project's librdkafka clients.
"""

from __future__ import annotations

import asyncio
from typing import Any

from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as driver

SCHEME = "clipstream-kafka"
fetch_max_wait_ms = 100  # set from ``BatcherSettings`` before the app starts
PREFETCH_BACKOFF_S = 3600.0  # "never" fetch around a partition whose records wait to be consumed


class ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_consumer(self, loop: asyncio.AbstractEventLoop) -> Any:
        consumer = super()._create_consumer(loop)
        consumer._fetch_max_wait_ms = fetch_max_wait_ms  # handed to its Fetcher at start()
        return consumer

    async def on_start(self) -> None:
        await super().on_start()
        self._consumer._fetcher._prefetch_backoff = PREFETCH_BACKOFF_S  # the Fetcher exists once started


class Consumer(driver.Consumer):
    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(driver.Transport):
    Consumer = Consumer


TRANSPORTS.aliases[SCHEME] = f"{__name__}:Transport"
