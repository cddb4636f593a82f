"""The topic catalogue, topic creation, the Kafka client settings, and the Kafka runtime every
stage uses: ``intake`` (consumer -> event loop), ``offsets`` (start offsets, commits),
``emitter`` (producer and delivery reports), ``deadletters``, ``stage`` (the ``ready:`` line)."""

from topics.catalogue import Catalogue, TopicSpec, check_name
from topics.client import aiokafka_kwargs, consumer_config, producer_config

__all__ = ["Catalogue", "TopicSpec", "aiokafka_kwargs", "check_name", "consumer_config", "producer_config"]
