"""Cluster administration: the nameserver's cluster status, users and ACLs (super users; the
nameservers store them in etcd)."""

from __future__ import annotations

import dataclasses
from typing import Any

from gms.client.admin.base import AdminBase
from gms.protocol.codes import RequestCode
from gms.security.acl import AclRule
from gms.security.scram import Credential
from gms.security.users import check_user_name


class ClusterAdmin(AdminBase):
    """The cluster, user and ACL calls of :class:`~gms.client.admin.AsyncAdmin`."""

    async def cluster_status(self) -> dict[str, Any]:
        """The nameserver's CLUSTER_STATUS: etcd health, live nameservers and brokers."""
        if self._nameserver is None:
            raise ValueError("cluster status comes from a nameserver; this Admin was given brokers")
        return await self._ask_nameserver(RequestCode.CLUSTER_STATUS)

    async def put_user(self, name: str, password: str, *, role: str = "normal") -> None:
        """Create ``name`` or replace its password and role. Only a salted SCRAM verifier computed
        here leaves this process, never the password."""
        check_user_name(name)
        credential = Credential.for_password(password)
        await self._ask_nameserver(RequestCode.USER_PUT, {"name": name, "role": role,
                                                    "credential": credential.to_json()})

    async def delete_user(self, name: str) -> bool:
        """False if there was no such user. Its open connections stay authenticated until closed."""
        return bool((await self._ask_nameserver(RequestCode.USER_DELETE, {"name": name}))["deleted"])

    async def users(self) -> list[dict[str, str]]:
        """Every user's ``name`` and ``role`` (brokers' own identities not included)."""
        return list((await self._ask_nameserver(RequestCode.USER_LIST))["users"])

    async def add_acl(self, rule: AclRule) -> bool:
        """False if the same rule was there already; in force on every broker within a second."""
        return bool((await self._ask_nameserver(RequestCode.ACL_ADD, {"acl": dataclasses.asdict(rule)}))["added"])

    async def remove_acl(self, rule: AclRule) -> bool:
        """False if there was no such rule."""
        return bool((await self._ask_nameserver(RequestCode.ACL_REMOVE, {"acl": dataclasses.asdict(rule)}))["removed"])

    async def acls(self) -> list[AclRule]:
        return [AclRule(**fields) for fields in (await self._ask_nameserver(RequestCode.ACL_LIST))["acls"]]
