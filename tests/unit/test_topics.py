"""The topic catalogue and Kafka client settings (no broker)."""

from __future__ import annotations

import pytest

from clipstream.errors import ConfigError
from clipstream.settings import Settings
from topics import Catalogue, aiokafka_kwargs, consumer_config, producer_config
from topics.client import CLUSTER_METADATA_REFRESH_MS, admin_config


def test_names_carry_the_prefix_and_model():
    cat = Catalogue(prefix="x.", selector_partitions=3)
    assert cat.queries.name == "x.queries"
    assert cat.requests("logreg").name == "x.requests.logreg"
    assert cat.batches("logreg", replicas=4).partitions == 4
    assert cat.batch_stats("logreg").name == "x.batch-stats.logreg"
    assert cat.replies("gw-1").name == "x.replies.gw-1"


def test_queries_and_predictions_are_co_partitioned():
    cat = Catalogue(selector_partitions=6)
    assert cat.queries.partitions == cat.predictions.partitions == 6


def test_registry_and_schemas_are_compacted_and_others_are_not():
    cat = Catalogue()
    assert cat.registry.compacted and cat.schemas.compacted  # one record per key kept for good
    assert not any(spec.compacted for spec in cat.core() if spec.name not in (cat.registry.name, cat.schemas.name))
    assert cat.deadletter.name.endswith("deadletter")


@pytest.mark.parametrize("bad", ["", "a b", "../x", "x" * 200, "é"])
def test_bad_model_names_are_refused(bad):
    with pytest.raises(ConfigError, match="not allowed"):
        Catalogue().requests(bad)


def test_low_latency_client_defaults_and_security_pass_through():
    s = Settings(
        kafka_bootstrap="h:1",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="u",
        kafka_sasl_password="p",
    )
    p = producer_config(s)
    assert p["linger.ms"] == 0 and p["socket.nagle.disable"] is True
    assert p["security.protocol"] == "SASL_SSL" and p["sasl.username"] == "u"
    c = consumer_config(s, "g", **{"enable.auto.commit": False})
    assert c["group.id"] == "g" and c["enable.auto.commit"] is False
    assert c["fetch.min.bytes"] == 1


def test_clients_of_a_cluster_refresh_their_leaders_often():
    """Several bootstrap brokers: a cluster that can fail over, so every client refreshes its
    topics' leaders every 500 ms; one broker keeps librdkafka's default; a setting wins."""
    key = "topic.metadata.refresh.interval.ms"
    one = Settings(kafka_bootstrap="h:1")
    assert all(key not in conf for conf in (producer_config(one), consumer_config(one, "g"), admin_config(one)))
    assert "metadata_max_age_ms" not in aiokafka_kwargs(one)
    cluster = Settings(kafka_bootstrap="h:1,h:2, h:3")
    for conf in (producer_config(cluster), consumer_config(cluster, "g"), admin_config(cluster)):
        assert conf[key] == CLUSTER_METADATA_REFRESH_MS == 500
    assert aiokafka_kwargs(cluster)["metadata_max_age_ms"] == 500
    assert producer_config(Settings(kafka_bootstrap="h:1", kafka_metadata_refresh_ms=1000))[key] == 1000
    assert consumer_config(Settings(kafka_bootstrap="h:1,h:2", kafka_metadata_refresh_ms=5000), "g")[key] == 5000
    with pytest.raises(ValueError):
        Settings(kafka_metadata_refresh_ms=0)


def test_settings_read_the_environment(monkeypatch):
    monkeypatch.setenv("CLIPSTREAM_KAFKA_BOOTSTRAP", "10.1.2.3:9999")
    monkeypatch.setenv("CLIPSTREAM_REDIS_URL", "redis://h:1/2")
    s = Settings()
    assert s.kafka_bootstrap == "10.1.2.3:9999"
    assert s.redis_url == "redis://h:1/2"
