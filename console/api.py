"""The console's JSON API, which its pages render (and scripts may read):

- ``GET /api/config``: version, nameserver, whether admin actions are on (and how to turn them on), the
  sampling interval;
- ``GET /api/cluster``: nameservers, controller, brokers, etcd health, queues needing attention;
- ``GET /api/topics``, ``GET /api/topics/{topic}``: topics, one topic's queues and its rate history;
- ``GET /api/groups``, ``GET /api/groups/{group}``: groups, one group's members, lag and lag history;
- ``GET /api/messages/{msg_id}``: one message by id;
- ``GET /api/keys?topic=T&key=K``: the newest messages of a topic carrying a key;
- ``POST /api/topics``, ``POST /api/groups/{group}/reset-offsets``: admin actions (``--admin``;
  otherwise 403).

Reads run in threads (the Admin client is synchronous); failures become JSON in
:mod:`gms.console.http_errors`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gms import __version__
from gms.console import ADMIN_HOW
from gms.console.actions import AdminActions
from gms.console.data import BadInput, ConsoleData
from gms.console.guards import check_same_origin
from gms.console.history import History
from gms.console.http_errors import Refused

ADMIN_OFF = ("admin actions are off: this console is read-only. Restart it with `{how}` to create topics and"
             " reset offsets")


class ConsoleApi:
    """The handlers; ``actions`` is None on a read-only console."""

    def __init__(self, data: ConsoleData, history: History, actions: AdminActions | None, *, nameserver: str,
                 admin_how: str = ADMIN_HOW) -> None:
        self._data = data
        self._admin_how = admin_how
        self._history = history
        self._actions = actions
        self._nameserver = nameserver

    def add_routes(self, app: web.Application) -> None:
        app.add_routes([
            web.get("/api/config", self.config),
            web.get("/api/cluster", self.cluster),
            web.get("/api/topics", self.topics),
            web.get("/api/topics/{topic}", self.topic),
            web.get("/api/groups", self.groups),
            web.get("/api/groups/{group}", self.group),
            web.get("/api/messages/{msg_id}", self.message),
            web.get("/api/keys", self.find_by_key),
            web.post("/api/topics", self.create_topic),
            web.post("/api/groups/{group}/reset-offsets", self.reset_offsets),
        ])

    async def config(self, request: web.Request) -> web.Response:
        return web.json_response({"version": __version__, "nameserver": self._nameserver,
                                  "admin": self._actions is not None, "admin_how": self._admin_how,
                                  "sample_interval_s": self._history.interval_s,
                                  "history_s": self._history.window_s})

    async def cluster(self, request: web.Request) -> web.Response:
        return web.json_response(await asyncio.to_thread(self._data.cluster))

    async def topics(self, request: web.Request) -> web.Response:
        rows = await asyncio.to_thread(self._data.topics)
        return web.json_response({"topics": [{**row, "rate": self._history.latest_rate(row["topic"])} for row in rows]})

    async def topic(self, request: web.Request) -> web.Response:
        name = request.match_info["topic"]
        described = await asyncio.to_thread(self._data.topic, name)
        return web.json_response({**described, "rate": self._history.latest_rate(name),
                                  "history": self._history.topic_rates(name)})

    async def groups(self, request: web.Request) -> web.Response:
        return web.json_response({"groups": await asyncio.to_thread(self._data.groups)})

    async def group(self, request: web.Request) -> web.Response:
        name = request.match_info["group"]
        described = await asyncio.to_thread(self._data.group, name)
        return web.json_response({**described, "history": self._history.group_lag(name)})

    async def find_by_key(self, request: web.Request) -> web.Response:
        query = request.query
        return web.json_response(await asyncio.to_thread(self._data.find_by_key, query.get("topic", ""),
                                                         query.get("key", "")))

    async def message(self, request: web.Request) -> web.Response:
        return web.json_response(await asyncio.to_thread(self._data.message, request.match_info["msg_id"]))

    async def create_topic(self, request: web.Request) -> web.Response:
        actions = self._admin_actions(request)
        body = await _json_body(request)
        return web.json_response(await asyncio.to_thread(actions.create_topic, body), status=201)

    async def reset_offsets(self, request: web.Request) -> web.Response:
        actions = self._admin_actions(request)
        body = await _json_body(request)
        return web.json_response(await asyncio.to_thread(actions.reset_offsets, request.match_info["group"], body))

    def _admin_actions(self, request: web.Request) -> AdminActions:
        """The actions, unless they are off or the request comes from another site's page."""
        if self._actions is None:
            raise Refused(403, "AdminActionsOff", ADMIN_OFF.format(how=self._admin_how))
        check_same_origin(request)
        return self._actions


async def _json_body(request: web.Request) -> Mapping[str, Any]:
    """The posted JSON object. Only ``application/json`` is taken: another site's page cannot send
    that content type without a CORS preflight, which the console never grants."""
    if request.content_type != "application/json":
        raise BadInput("send the action as JSON (Content-Type: application/json)")
    try:
        body = json.loads(await request.read())
    except ValueError as err:
        raise BadInput(f"the request body is not JSON: {err}") from err
    if not isinstance(body, dict):
        raise BadInput("the request body must be a JSON object")
    return body
