"""Calling the broker's request handlers directly from the RocketMQ endpoint (no socket to
ourselves): the frame a handler takes, and its answer whether the handler is sync or async."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any

from gms.protocol.codes import RequestCode
from gms.protocol.frame import Frame, Response


def request_frame(code: RequestCode, fields: dict[str, Any]) -> Frame:
    return Frame(code=int(code), request_id=0, fields=fields)


async def settled(result: Response | Awaitable[Response | None] | None) -> Response:
    if inspect.isawaitable(result):
        result = await result
    assert isinstance(result, Response)
    return result
