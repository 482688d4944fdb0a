"""``gms user`` and ``gms acl``: who may connect to a secured cluster and what each may do.

Both need a super user (``gms --user admin ...``); docs/security.md explains the model."""

from __future__ import annotations

from collections.abc import Callable

import click

from gms.cli.admin_context import open_admin
from gms.cli.options import json_option, nameserver_option
from gms.cli.output import print_json, show, table
from gms.cluster.etcd_client import EtcdAuth, EtcdClient
from gms.cluster.metadata import DEFAULT_PREFIX, ClusterMetadata
from gms.security.acl import OPERATIONS, WILDCARD, AclRule
from gms.security.scram import Credential
from gms.security.users import USER_ROLES, User


@click.group()
def user() -> None:
    """Add, delete and list the users of a secured cluster (stored in etcd as SCRAM verifiers)."""


@user.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(USER_ROLES), default="normal", show_default=True,
              help="super: everything; normal: what ACLs allow (without ACLs: publish, subscribe, describe);"
                   " broker: a broker's registration credential.")
@click.option("--new-password", prompt="Password for the user", hide_input=True, confirmation_prompt=True,
              envvar="GMS_NEW_PASSWORD", show_envvar=True,
              help="The user's password (prompted for when not given; never sent, only its SCRAM verifier).")
@nameserver_option
@click.option("--etcd", envvar="GMS_ETCD", show_envvar=True,
              help="Write the user straight into this etcd (host:port[,...]) instead of asking a nameserver: how the"
                   " first super user of a cluster is made. Whoever holds etcd's credentials is trusted.")
@click.option("--etcd-user", envvar="GMS_ETCD_USER", show_envvar=True, help="etcd user, when etcd has authentication.")
@click.option("--etcd-password", envvar="GMS_ETCD_PASSWORD", show_envvar=True, help="Password of --etcd-user.")
@click.option("--etcd-ca", type=click.Path(dir_okay=False, exists=True), envvar="GMS_ETCD_CA", show_envvar=True,
              help="CA of etcd's certificate (TLS to etcd).")
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, help="The cluster's etcd key prefix (--etcd).")
def user_add(name: str, role: str, new_password: str, nameserver: str, etcd: str | None, etcd_user: str | None,
             etcd_password: str | None, etcd_ca: str | None, prefix: str) -> None:
    """Create user NAME, or replace its password and role."""
    try:
        if etcd:
            auth = EtcdAuth(etcd_user or "", etcd_password or "", etcd_ca or "")
            with EtcdClient(etcd, auth=auth) as client:
                ClusterMetadata(client, prefix).put_user(User(name, role, Credential.for_password(new_password)))
        else:
            with open_admin(nameserver) as admin:
                admin.put_user(name, new_password, role=role)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err
    click.echo(f"user {name} ({role}) saved")


@user.command("delete")
@click.argument("name")
@nameserver_option
def user_delete(name: str, nameserver: str) -> None:
    """Delete user NAME (connections it already opened stay open until they close)."""
    with open_admin(nameserver) as admin:
        if not admin.delete_user(name):
            raise click.ClickException(f"there is no user {name}")
    click.echo(f"user {name} deleted")


@user.command("list")
@nameserver_option
@json_option
def user_list(nameserver: str, as_json: bool) -> None:
    """List the users and their roles."""
    with open_admin(nameserver) as admin:
        users = admin.users()
    if as_json:
        print_json(users)
    else:
        show(table("users", ["user", "role"], [(u["name"], u["role"]) for u in users]))


def _rule_options(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed((
        click.option("--principal", "-p", required=True, help=f"A user name, or {WILDCARD!r} for every user."),
        click.option("--topic", help="The topic (or topic prefix with --prefix; '*': every topic)."),
        click.option("--group", help="The consumer group (or prefix with --prefix; '*': every group)."),
        click.option("--cluster", is_flag=True, help="The cluster itself (listing topics, cluster status)."),
        click.option("--prefix", is_flag=True, help="--topic / --group is a name prefix, not a name."),
        click.option("--operation", "-o", type=click.Choice(OPERATIONS), required=True,
                     help="publish, subscribe, describe, admin, or all of them."),
        click.option("--deny", is_flag=True, help="A deny rule (deny beats allow) instead of an allow rule."),
        nameserver_option,
    )):
        command = option(command)
    return command


def _rule(principal: str, topic: str | None, group: str | None, cluster: bool, prefix: bool, operation: str,
          deny: bool) -> AclRule:
    given = [(kind, name) for kind, name in (("topic", topic), ("group", group), ("cluster", WILDCARD if cluster
                                                                                  else None)) if name]
    if len(given) != 1:
        raise click.UsageError("name exactly one resource: --topic, --group or --cluster")
    resource_type, pattern = given[0]
    try:
        return AclRule(principal, resource_type, pattern, operation, pattern_type="prefix" if prefix else "literal",
                       permission="deny" if deny else "allow")
    except ValueError as err:
        raise click.UsageError(str(err)) from err


@click.group()
def acl() -> None:
    """Add, remove and list ACL rules (enforced by servers started with --acl; deny by default)."""


@acl.command("add", short_help="Add an allow or deny rule.")
@_rule_options
def acl_add(nameserver: str, **rule: object) -> None:
    """Add a rule: `gms acl add -p alice --topic orders -o publish` lets alice send to orders."""
    added = _rule(**rule)  # type: ignore[arg-type]
    with open_admin(nameserver) as admin:
        new = admin.add_acl(added)
    click.echo(("added: " if new else "already there: ") + added.describe())


@acl.command("remove")
@_rule_options
def acl_remove(nameserver: str, **rule: object) -> None:
    """Remove a rule (the same options it was added with)."""
    removed = _rule(**rule)  # type: ignore[arg-type]
    with open_admin(nameserver) as admin:
        if not admin.remove_acl(removed):
            raise click.ClickException(f"no such rule: {removed.describe()}")
    click.echo("removed: " + removed.describe())


@acl.command("list")
@nameserver_option
@json_option
def acl_list(nameserver: str, as_json: bool) -> None:
    """List every rule."""
    with open_admin(nameserver) as admin:
        rules = admin.acls()
    if as_json:
        print_json([vars(r) for r in rules])
    else:
        show(table("ACL rules", ["permission", "principal", "operation", "resource", "pattern", "pattern type"],
                   [(r.permission, r.principal, r.operation, r.resource_type, r.pattern, r.pattern_type)
                    for r in rules]))
