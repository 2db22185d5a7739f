"""The production shape's services, started by the tests as the stack starts them (``runtime/``): three Kafka
brokers in a quorum of three controllers. Each test module that needs them gets its own, so a fault one test
injects never reaches another. (What each fault cost is reported at the end of the run: ``tests/conftest.py``,
``record_recovery``.)"""

from __future__ import annotations

import pytest

from runtime.kafka_cluster import LocalKafkaCluster
from tests.conftest import PRIVATE_BROKER_JAVA_OPTIONS, stack_settings


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory):
    own = stack_settings(tmp_path_factory.mktemp("cluster"), kafka_broker_java_options=PRIVATE_BROKER_JAVA_OPTIONS)
    cluster = LocalKafkaCluster.on_free_ports(own)
    cluster.start()
    yield cluster
    cluster.stop(timeout_s=5)  # the last node cannot shut down in order without a quorum; its data is the test's
