"""faust's aiokafka transport with a short fetch wait, for the batcher's ``batch-stats`` agent.

faust asks the broker to hold each fetch up to 1.5 s (``fetch_max_wait_ms``, fixed in faust),
and aiokafka leaves a partition out of a fetch while records of it are still buffered. When
faust also read ``requests.<model>``, a fetch in flight for ``batch-stats`` alone stalled newly
arrived requests for up to 1.5 s (seen in ``bench.cache``). Requests are now read by
``intake.py``, so this only bounds how long faust's fetch can sit idle; 200 ms is kept as the
measured-safe value (shorter waits cost throughput in ``bench.batching``).
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
