"""The console's admin actions (``gms console --admin``): create a topic, reset a group's offsets.

Each takes the JSON body a page posted, checks it (:class:`BadInput` says what to send) and
makes the same :class:`gms.client.Admin` call as ``gms topic create`` and ``gms group
reset-offsets --execute``, with the console's credentials: on a secured cluster the
nameserver and brokers decide whether its user may.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gms.client import Admin
from gms.client.admin import DEFAULT_QUEUE_COUNT
from gms.client.offset_reset import ResetMode, ResetSpec
from gms.console.data import BadInput
from gms.times import parse_time_ms

QUEUES_MAX = 1024  # as `gms topic create --queues`
REPLICAS_MAX = 16


class AdminActions:
    def __init__(self, admin: Admin) -> None:
        self._admin = admin

    def create_topic(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``{"topic", "queues"?, "replicas"?}`` → the new topic's queues and their leaders."""
        topic = _text(body, "topic")
        queues = _integer(body, "queues", DEFAULT_QUEUE_COUNT, 1, QUEUES_MAX)
        replicas = _integer(body, "replicas", 1, 1, REPLICAS_MAX)
        route = self._admin.create_topic(topic, queues, replicas=replicas)
        return {"topic": topic, "queues": route["queues"]}

    def reset_offsets(self, group: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``{"topic", "to", "value"?, "force"?}`` moves ``group``'s committed offsets on every queue
        of the topic: ``to`` is earliest, latest, offset (``value``: the offset), shift-by
        (``value``: how far, negative to consume again) or datetime (``value``: epoch ms or ISO
        8601). Refused while the group has live members unless ``force``."""
        topic = _text(body, "topic")
        spec = _reset_spec(body)
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise BadInput("'force' must be true or false")
        rows = self._admin.reset_offsets(group, [topic], spec, execute=True, force=force)
        return {"group": group, "topic": topic, "queues": [row._asdict() for row in rows]}


def _reset_spec(body: Mapping[str, Any]) -> ResetSpec:
    modes = ", ".join(m.value for m in ResetMode)
    to: Any = body.get("to")
    try:
        mode = ResetMode(to)
    except ValueError:
        raise BadInput(f"'to' must be one of {modes}, not {to!r}") from None
    if mode in (ResetMode.EARLIEST, ResetMode.LATEST):
        return ResetSpec(mode)
    value: Any = body.get("value")
    if mode is ResetMode.DATETIME:
        try:
            return ResetSpec.to_datetime(value if _is_int(value) else parse_time_ms(str(value)))
        except ValueError as err:
            raise BadInput(f"'value' of a datetime reset: {err}") from err
    if not _is_int(value) or (mode is ResetMode.OFFSET and value < 0):
        raise BadInput(f"'value' of a {mode.value} reset must be an integer"
                       + (" of at least 0" if mode is ResetMode.OFFSET else ""))
    return ResetSpec(mode, value)


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise BadInput(f"'{name}' is required (a non-empty string)")
    return value.strip()


def _integer(body: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if not _is_int(value) or not low <= value <= high:
        raise BadInput(f"'{name}' must be an integer from {low} to {high}, not {value!r}")
    return int(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
