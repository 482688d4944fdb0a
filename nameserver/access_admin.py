"""The nameserver's user and ACL requests (super users only: see :mod:`gms.nameserver.access`):
users and rules are kept in etcd, and every broker follows them through its own watch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from gms.errors import BadRequestError
from gms.nameserver.writes import MetadataWrites
from gms.net.server import Handler
from gms.protocol.codes import RequestCode
from gms.protocol.fields import field
from gms.protocol.frame import Frame, Response
from gms.security.acl import AclRule
from gms.security.scram import Credential
from gms.security.users import USER_ROLES, User


class AccessAdmin:
    """USER_PUT / USER_DELETE / USER_LIST and ACL_ADD / ACL_REMOVE / ACL_LIST."""

    def __init__(self, writes: MetadataWrites) -> None:
        self._writes = writes

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.USER_PUT: self._put_user,
            RequestCode.USER_DELETE: self._delete_user,
            RequestCode.USER_LIST: self._list_users,
            RequestCode.ACL_ADD: self._add_acl,
            RequestCode.ACL_REMOVE: self._remove_acl,
            RequestCode.ACL_LIST: self._list_acls,
        }

    async def _put_user(self, request: Frame) -> Response:
        """Create or update a user; the client sends the SCRAM verifier, never the password."""
        fields = request.fields
        role = field(fields, "role", str, "normal")
        if role not in USER_ROLES:
            raise BadRequestError(f"role must be one of {', '.join(USER_ROLES)}, not {role!r}")
        try:
            user = User(field(fields, "name", str), role, Credential.from_json(field(fields, "credential", dict)))
        except (KeyError, ValueError, TypeError) as err:
            raise BadRequestError(f"bad user credential: {err}") from err
        metadata = self._writes.metadata()
        await self._writes.write(f"save user {user.name}", lambda: self._checked(metadata.put_user, user))
        await self._writes.until_view(lambda: self._writes.view().user(user.name) == user)
        return Response()

    async def _delete_user(self, request: Frame) -> Response:
        name = field(request.fields, "name", str)
        metadata = self._writes.metadata()
        existed = await self._writes.write(f"delete user {name}", lambda: self._checked(metadata.delete_user, name))
        await self._writes.until_view(lambda: self._writes.view().user(name) is None)
        return Response({"deleted": bool(existed)})

    async def _list_users(self, request: Frame) -> Response:
        metadata = self._writes.metadata()
        users = await self._writes.write("list users", metadata.list_users)
        return Response({"users": [{"name": u.name, "role": u.role} for u in users]})

    async def _add_acl(self, request: Frame) -> Response:
        rule = self._rule(request)
        metadata = self._writes.metadata()
        added = await self._writes.write(f"add ACL {rule.describe()}", lambda: metadata.put_acl(rule))
        await self._writes.until_view(lambda: rule in self._writes.view().acls().rules())
        return Response({"added": bool(added)})

    async def _remove_acl(self, request: Frame) -> Response:
        rule = self._rule(request)
        metadata = self._writes.metadata()
        removed = await self._writes.write(f"remove ACL {rule.describe()}", lambda: metadata.delete_acl(rule))
        await self._writes.until_view(lambda: rule not in self._writes.view().acls().rules())
        return Response({"removed": bool(removed)})

    async def _list_acls(self, request: Frame) -> Response:
        return Response({"acls": [asdict(rule) for rule in self._writes.view().acls().rules()]})

    @staticmethod
    def _rule(request: Frame) -> AclRule:
        try:
            return AclRule(**field(request.fields, "acl", dict))
        except (TypeError, ValueError) as err:
            raise BadRequestError(f"bad ACL: {err}") from err

    @staticmethod
    def _checked(fn: Callable[[Any], Any], arg: Any) -> Any:
        """``fn(arg)``, its ValueError (a bad name) as the client's BAD_REQUEST."""
        try:
            return fn(arg)
        except ValueError as err:
            raise BadRequestError(str(err)) from err
