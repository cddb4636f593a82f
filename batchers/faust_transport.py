"""faust's aiokafka transport with a short fetch wait, for the batcher.

aiokafka leaves a partition out of a fetch while records of it are still buffered (for more
than ``prefetch_backoff``, 100 ms), and faust asks the broker to hold each fetch up to 1.5 s
(``fetch_max_wait_ms``, fixed in faust). A batcher reads two one-partition topics from the same
broker: when the fetch in flight covers only ``batch-stats`` (requests still had unconsumed
records as it left, the batcher being busy), newly arrived requests wait until a stats record
comes or 1.5 s pass; with every request answered from the cache no stats come at all, and
requests stalled 1.5 s (seen in ``bench.cache``: the batcher's ``batcher_in`` stamp 1.6 s after
the selector's ``dispatched``). So the broker holds a fetch 200 ms at most, which bounds that
stall. Shorter waits cost throughput under load (25 ms: the layer's goodput on the simulated
accelerator fell from ~550 to ~350 q/s in ``bench.batching``), and never fetching around
unconsumed records starves ``batch-stats`` under overload (no credit comes back while a
backlog of requests is worked through, and the device idles): both measured, and dropped.
"""

from __future__ import annotations

import asyncio
from typing import Any

from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as driver

SCHEME = "clipstream-kafka"
fetch_max_wait_ms = 200  # set from ``BatcherSettings`` before the app starts


class ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_consumer(self, loop: asyncio.AbstractEventLoop) -> Any:
        consumer = super()._create_consumer(loop)
        consumer._fetch_max_wait_ms = fetch_max_wait_ms  # handed to its Fetcher at start()
        return consumer


class Consumer(driver.Consumer):
    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(driver.Transport):
    Consumer = Consumer


TRANSPORTS.aliases[SCHEME] = f"{__name__}:Transport"
