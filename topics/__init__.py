"""The topic catalogue, topic creation, and the Kafka client settings every stage uses."""

from topics.catalogue import Catalogue, TopicSpec, check_name
from topics.client import aiokafka_kwargs, consumer_config, producer_config

__all__ = ["Catalogue", "TopicSpec", "aiokafka_kwargs", "check_name", "consumer_config", "producer_config"]
