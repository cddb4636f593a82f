"""What `up` says about Kafka's brokers and Redis while it serves: each change once."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from clipstream.infra.watch import InfraWatch


class Cluster:
    def __init__(self) -> None:
        self.listed: dict[int, str] | None = {1: "h:1", 2: "h:2", 3: "h:3"}
        self.redis = True

    def brokers(self) -> dict[int, str]:
        if self.listed is None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers are down\nmore"))
        return dict(self.listed)


def test_a_broker_that_leaves_and_comes_back_is_said_once_each() -> None:
    cluster, lines = Cluster(), []
    watch = InfraWatch(cluster.brokers, lambda: cluster.redis, lines.append, "restart it with X")
    watch.check()
    assert lines == []  # all there: nothing to say
    cluster.listed = {1: "h:1", 2: "h:2"}
    watch.check()
    watch.check()
    assert lines == ["alert: kafka: broker 3 (h:3) left the cluster; its partitions have a copy fewer until it is "
                     "back, and a model's topics cannot be made meanwhile. restart it with X"]
    cluster.listed = {1: "h:1", 2: "h:2", 3: "h:3"}
    watch.check()
    watch.check()
    assert lines[1:] == ["kafka: broker 3 (h:3) is back"]


def test_kafka_and_redis_away_and_back_are_said_once_each() -> None:
    cluster, lines = Cluster(), []
    watch = InfraWatch(cluster.brokers, lambda: cluster.redis, lines.append, "restart it with X")
    watch.check()
    cluster.listed, cluster.redis = None, False
    watch.check()
    watch.check()
    assert len(lines) == 2 and lines[0].startswith("alert: kafka: no broker answers (all brokers are down);")
    assert lines[1].startswith("alert: redis: does not answer; queries are answered without the prediction cache")
    cluster.listed, cluster.redis = {1: "h:1", 2: "h:2", 3: "h:3"}, True
    watch.check()
    assert lines[2:] == ["kafka: answers again", "redis: answers again"]


def test_a_redis_check_that_raises_counts_as_away() -> None:
    def frozen() -> bool:
        raise TimeoutError("Timeout reading from socket")

    lines: list[str] = []
    InfraWatch(Cluster().brokers, frozen, lines.append, "").check()
    assert len(lines) == 1 and lines[0].startswith("alert: redis:")
