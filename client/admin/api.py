"""The admin client, the helper behind scripts, tests and the ``gms`` CLI: an asyncio core
(:class:`AsyncAdmin`, its calls grouped by what they administer in the modules beside this one)
and its synchronous facade (:class:`Admin`).

With ``nameserver=...`` topic changes are cluster metadata (the nameserver places the queues
and the brokers create them); inspection asks the brokers the routes name. With ``brokers=[...]``
every call goes to each of those brokers."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from gms.client.admin.cluster import ClusterAdmin
from gms.client.admin.groups import GroupAdmin
from gms.client.admin.messages import MessageAdmin
from gms.client.admin.topics import TopicAdmin
from gms.client.runtime import REQUEST_TIMEOUT_MS, ClientRuntime
from gms.cluster.model import GroupSettings
from gms.security.client import ClientSecurity


class AsyncAdmin(TopicAdmin, GroupAdmin, ClusterAdmin, MessageAdmin):
    """Administers a cluster through its nameservers, or a fixed list of brokers, from asyncio code
    (on the caller's running loop; ``async with`` or ``await aclose()``). Every call of
    :class:`Admin` is this class's, run on the synchronous admin's loop thread. The calls are
    grouped by what they administer: topics, groups, the cluster, messages."""


P = ParamSpec("P")
R = TypeVar("R")


def _on_loop_thread(method: Callable[Concatenate[AsyncAdmin, P], Coroutine[Any, Any, R]],
                    ) -> Callable[Concatenate[Admin, P], R]:
    """``method`` of the async core, as the synchronous admin's: run on its loop thread."""

    def call(self: Admin, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._runtime.run(method(self._core, *args, **kwargs))
    call.__name__, call.__qualname__, call.__doc__ = method.__name__, f"Admin.{method.__name__}", method.__doc__
    return call


class Admin:
    """Administers a cluster through its nameservers, or a fixed list of brokers: the calls of
    :class:`AsyncAdmin` (see each there), waited for on a loop thread of its own."""

    def __init__(self, brokers: Sequence[str] | str | None = None, *,
                 nameserver: Sequence[str] | str | None = None,
                 request_timeout_ms: float = REQUEST_TIMEOUT_MS, security: ClientSecurity | None = None) -> None:
        """``security``: TLS and user (None: from ``GMS_TLS_*``, ``GMS_USER``, ``GMS_PASSWORD``)."""
        self._runtime = ClientRuntime(brokers, nameserver=nameserver, request_timeout_ms=request_timeout_ms,
                                      name="gms-admin", security=security)
        self._core = AsyncAdmin._driven(self._runtime)

    brokers = _on_loop_thread(AsyncAdmin.brokers)
    _ask_nameserver = _on_loop_thread(AsyncAdmin._ask_nameserver)
    create_topic = _on_loop_thread(AsyncAdmin.create_topic)
    create_topics = _on_loop_thread(AsyncAdmin.create_topics)
    update_topic = _on_loop_thread(AsyncAdmin.update_topic)
    delete_topic = _on_loop_thread(AsyncAdmin.delete_topic)
    delete_topics = _on_loop_thread(AsyncAdmin.delete_topics)
    topics = _on_loop_thread(AsyncAdmin.topics)
    route = _on_loop_thread(AsyncAdmin.route)
    topic_stats = _on_loop_thread(AsyncAdmin.topic_stats)
    topics_stats = _on_loop_thread(AsyncAdmin.topics_stats)
    broker_status = _on_loop_thread(AsyncAdmin.broker_status)
    cluster_status = _on_loop_thread(AsyncAdmin.cluster_status)
    group_describe = _on_loop_thread(AsyncAdmin.group_describe)
    group_coordinator = _on_loop_thread(AsyncAdmin.group_coordinator)
    groups = _on_loop_thread(AsyncAdmin.groups)
    live_members = _on_loop_thread(AsyncAdmin.live_members)
    reset_offsets = _on_loop_thread(AsyncAdmin.reset_offsets)
    delete_group = _on_loop_thread(AsyncAdmin.delete_group)
    group_settings = _on_loop_thread(AsyncAdmin.group_settings)
    delete_group_settings = _on_loop_thread(AsyncAdmin.delete_group_settings)
    put_user = _on_loop_thread(AsyncAdmin.put_user)
    delete_user = _on_loop_thread(AsyncAdmin.delete_user)
    users = _on_loop_thread(AsyncAdmin.users)
    add_acl = _on_loop_thread(AsyncAdmin.add_acl)
    remove_acl = _on_loop_thread(AsyncAdmin.remove_acl)
    acls = _on_loop_thread(AsyncAdmin.acls)
    cancel_scheduled = _on_loop_thread(AsyncAdmin.cancel_scheduled)
    view_message = _on_loop_thread(AsyncAdmin.view_message)
    find_by_key = _on_loop_thread(AsyncAdmin.find_by_key)
    list_transactions = _on_loop_thread(AsyncAdmin.list_transactions)
    end_transaction = _on_loop_thread(AsyncAdmin.end_transaction)
    trace = _on_loop_thread(AsyncAdmin.trace)

    def set_group_settings(self, group: str, *, create: bool = False, **settings: Any) -> GroupSettings:
        return self._runtime.run(self._core.set_group_settings(group, create=create, **settings))

    set_group_settings.__doc__ = AsyncAdmin.set_group_settings.__doc__

    def close(self) -> None:
        self._runtime.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
