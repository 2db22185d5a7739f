"""Read and change topic configs with confluent-kafka's AdminClient, remembering what was there.

A value set on the topic (``DYNAMIC_TOPIC_CONFIG``) and a broker or built-in default are different
things to restore: rolling back to a default means *deleting* the topic override
(``AlterConfigOpType.DELETE``), not setting the default's current value.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)


def _is_topic_override(source) -> bool:
    return getattr(source, "value", source) == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


@dataclasses.dataclass(frozen=True)
class ConfigValue:
    value: str | None
    #: False when the topic overrides it (the value is the topic's own)
    is_default: bool

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class TopicConfigError(RuntimeError):
    """The broker refused a change, or the change did not read back as written."""


def describe(admin: AdminClient, topics: list[str], timeout_s: float = 30.0) -> dict[str, dict[str, ConfigValue]]:
    """topic -> config name -> effective value (and whether it is the topic's own)."""
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in topics]
    result: dict[str, dict[str, ConfigValue]] = {}
    for resource, future in admin.describe_configs(resources, request_timeout=timeout_s).items():
        entries = future.result(timeout=timeout_s)
        result[resource.name] = {
            name: ConfigValue(entry.value, not _is_topic_override(entry.source)) for name, entry in entries.items()
        }
    return result


def alter(
    admin: AdminClient, topic: str, changes: Mapping[str, str | None], *, validate_only: bool, timeout_s: float = 30.0
) -> None:
    """Set each ``config -> value`` on ``topic``; a None value deletes the override (back to the
    default). Only the named configs change (incremental, unlike the legacy AlterConfigs).
    ``validate_only``: the broker checks the change and applies nothing (its own dry run)."""
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        if value is not None
        else ConfigEntry(name, None, incremental_operation=AlterConfigOpType.DELETE)
        for name, value in changes.items()
    ]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    futures = admin.incremental_alter_configs([resource], request_timeout=timeout_s, validate_only=validate_only)
    try:
        for future in futures.values():
            future.result(timeout=timeout_s)
    except KafkaException as err:
        what = "validating" if validate_only else "applying"
        raise TopicConfigError(f"{topic}: broker refused {what} {dict(changes)}: {err.args[0].str()}") from err


def mismatches(
    admin: AdminClient, topic: str, wanted: Mapping[str, ConfigValue], settle_s: float = 15.0
) -> dict[str, tuple]:
    """config -> (wanted, found) for every config of ``wanted`` that does not read back as wanted.
    For a default, only "is a default again" is compared (the default's value is the broker's).

    With KRaft the controller acknowledges a change once it is in the metadata log; the broker
    answering DescribeConfigs applies that log a moment later, so a read right after an alter can
    still show the old values. Re-read for up to ``settle_s`` before calling it a mismatch."""
    deadline = time.monotonic() + settle_s
    pause_s = 0.1
    while True:
        found = describe(admin, [topic])[topic]
        wrong = {}
        for name, want in wanted.items():
            have = found.get(name, ConfigValue(None, True))
            ok = have.is_default if want.is_default else (not have.is_default and have.value == want.value)
            if not ok:
                wrong[name] = (want, have)
        if not wrong or time.monotonic() >= deadline:
            return wrong
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, 2.0)
