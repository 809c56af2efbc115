"""Every Loopline Kafka client's settings, built one way.

One precedence rule: the client's defaults (Loopline's tuning: linger, compression, timeouts), then the user's
``client_config`` (``kafka.client_config``: TLS, SASL, their own tuning), then what the client's correctness requires
(an idempotent producer's ``acks=all``, a transactional producer's ``transactional.id``, a reader's
``isolation.level=read_committed`` and ``enable.auto.commit=false`` where offsets are committed after the effect).

A user setting that contradicts a requirement is refused (:class:`KafkaSettingConflict`, naming the key, the value the
client needs and why) rather than overridden in silence. Kafka's clients do the same with their own contradictions
(librdkafka refuses ``acks=1`` beside ``enable.idempotence=true``), and a user who set ``enable.auto.commit=true`` for
every client would otherwise believe in a setting that never took effect. A user value equal to the requirement passes.

Secrets: a key :func:`is_secret` names prints as ``**********`` (:func:`masked`) wherever Loopline shows client
settings, and in a refusal; a value may come as a ``SecretStr``, and its plain text goes only into the client's own dict.

This module sits in ``schemas/``, the leaf every component may import. ``infra/``'s admin clients do not use it: they
reach only the stack's own plaintext nodes, which ``infra/`` starts itself, so the user's settings for a cluster
elsewhere have nothing to say to them. The skew monitor's faust app is not built here either: faust (aiokafka) takes
settings of its own names, not librdkafka's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from pydantic import SecretStr

from schemas.errors import SchemasError

#: Keys whose values are secrets: librdkafka's sensitive properties, and the Java client's (the Flink job's tables
#: take the same ``client_config``).
SECRET_KEYS = frozenset(
    {
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "sasl.jaas.config",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.keystore.password",
        "ssl.keystore.key",
        "ssl.truststore.password",
    }
)
#: Words that mark any other key's value a secret too (a plugin's, a newer client's): masking one too many is harmless.
SECRET_WORDS = ("password", "secret", "token")
#: How a secret prints (as pydantic prints a ``SecretStr``).
MASK = str(SecretStr("secret"))
#: Spellings librdkafka takes as one value.
_SAME = {"acks": {"-1": "all"}}


class KafkaSettingConflict(SchemasError, ValueError):
    """A setting in the user's ``client_config`` contradicts what a Loopline client needs to be correct."""


class Requirement(NamedTuple):
    """A value a client cannot work correctly without, and why (the reason a refusal gives)."""

    value: object
    why: str


ClientConfig = Mapping[str, "str | SecretStr"]


def is_secret(key: str) -> bool:
    """Whether the value of ``key`` (in librdkafka's dotted form, or with underscores as an environment variable
    gives it) is a secret: one of :data:`SECRET_KEYS`, or named a password, secret or token."""
    dotted = key.lower().replace("_", ".")
    return dotted in SECRET_KEYS or key in SECRET_KEYS or any(word in dotted for word in SECRET_WORDS)


def masked(settings: Mapping[str, object]) -> dict[str, object]:
    """``settings`` as Loopline prints them: every secret as ``**********``."""
    return {key: MASK if is_secret(key) or isinstance(value, SecretStr) else value for key, value in settings.items()}


def client_settings(
    bootstrap_servers: str,
    client_config: ClientConfig | None,
    defaults: Mapping[str, object] | None = None,
    required: Mapping[str, Requirement] | None = None,
) -> dict[str, object]:
    """A client's librdkafka settings: ``defaults``, then the user's ``client_config``, then ``required`` (with the
    brokers at ``bootstrap_servers``); KafkaSettingConflict when the user's contradict a requirement."""
    needs = {"bootstrap.servers": Requirement(bootstrap_servers, "set the brokers with kafka.bootstrap_servers")}
    needs |= required or {}
    given = {key: _plain(value) for key, value in (client_config or {}).items()}
    for key, need in needs.items():
        if key in given and _canonical(key, given[key]) != _canonical(key, need.value):
            shown = MASK if is_secret(key) else repr(given[key])
            raise KafkaSettingConflict(
                f"kafka.client_config sets {key}={shown}, but this Loopline client needs {key}={need.value!r}: {need.why} "
                f"— fix: remove {key} from kafka.client_config"
            )
    return {**(defaults or {}), **given, **{key: need.value for key, need in needs.items()}}


def admin_settings(
    bootstrap_servers: str, client_config: ClientConfig | None, defaults: Mapping[str, object] | None = None
) -> dict[str, object]:
    """An admin client's settings (it needs nothing beyond the brokers)."""
    return client_settings(bootstrap_servers, client_config, defaults)


def producer_settings(
    bootstrap_servers: str, client_config: ClientConfig | None, defaults: Mapping[str, object] | None = None
) -> dict[str, object]:
    """An idempotent producer's settings: each record written once per partition, in order, by every in-sync replica."""
    return client_settings(bootstrap_servers, client_config, defaults, _IDEMPOTENT)


def transactional_producer_settings(
    bootstrap_servers: str,
    client_config: ClientConfig | None,
    transactional_id: str,
    defaults: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """A transactional producer's settings, as ``transactional_id`` (re-created with the same id, it fences off its
    predecessor's open transaction)."""
    required = {
        **_IDEMPOTENT,
        "transactional.id": Requirement(transactional_id, "each member's id fences its own predecessor, and no other"),
    }
    return client_settings(bootstrap_servers, client_config, defaults, required)


def consumer_settings(
    bootstrap_servers: str,
    client_config: ClientConfig | None,
    group_id: str,
    defaults: Mapping[str, object] | None = None,
    *,
    read_committed: bool = True,
) -> dict[str, object]:
    """A consumer's settings as a member of ``group_id``, committing offsets itself (after their records' effect, or
    never) and starting a partition it has no offset for at its oldest record. With ``read_committed`` it must read
    only committed transactions' records; without, the isolation is left to the defaults and the user (librdkafka's
    own default is read_committed too)."""
    required = {
        "group.id": Requirement(group_id, "each Loopline reader keeps its offsets under its own group"),
        "enable.auto.commit": Requirement(False, "offsets are committed after the records' effect, never before"),
        "auto.offset.reset": Requirement("earliest", "a group new to a topic reads what was written before it joined"),
    }
    if read_committed:
        required["isolation.level"] = Requirement(
            "read_committed", "an aborted transaction's records must never be read (exactly once)"
        )
    return client_settings(bootstrap_servers, client_config, defaults, required)


_IDEMPOTENT = {
    "enable.idempotence": Requirement(True, "a retried write must not be written twice or out of order"),
    "acks": Requirement("all", "a record counts as written once every in-sync replica holds it"),
}


def _plain(value: object) -> object:
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def _canonical(key: str, value: object) -> str:
    text = str(value).strip().lower()
    return _SAME.get(key, {}).get(text, text)
