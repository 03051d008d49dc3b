"""mqadmin's ACL commands: updateAclConfig, deleteAclConfig, clusterAclConfigVersion, updateGlobalWhiteAddr, getAclConfig.

Each goes to one broker (``-b``) or to a cluster (``-c``): edits to every master and slave of the
cluster (each broker keeps its own ``plain_acl.yml``), reads to its masters, as mqadmin does.  The
brokers answer only an admin account (``--access-key``/``--secret-key``) or a white-listed address.
"""

from __future__ import annotations

import time
from typing import Any

import click

from tidemq.admin._common import _run, admin
from tidemq.client.admin import AdminClient, AdminError
from tidemq.client.route import loads_lenient
from tidemq.remoting.codes import RequestCode


def _one_target(broker_addr: str | None, cluster: str | None) -> None:
    if bool(broker_addr) == bool(cluster):
        raise click.UsageError("give exactly one of -b/--brokerAddr and -c/--clusterName")


async def cluster_brokers(client: AdminClient, cluster: str, *, slaves: bool) -> list[str]:
    """Addresses of the cluster's masters (and slaves), in broker-name order; an error if unknown."""
    info = await client.cluster_info()
    names = (info.get("clusterAddrTable") or {}).get(cluster)
    if not names:
        raise AdminError(f"cluster {cluster!r} is unknown to the NameServer")
    out: list[str] = []
    for name in sorted(names):
        addrs = ((info.get("brokerAddrTable") or {}).get(name) or {}).get("brokerAddrs") or {}
        for broker_id, addr in sorted(addrs.items(), key=lambda kv: int(kv[0])):
            if slaves or int(broker_id) == 0:
                out.append(str(addr))
    return out


async def _targets(
    client: AdminClient, broker_addr: str | None, cluster: str | None, *, slaves: bool
) -> list[str]:
    if broker_addr:
        return [broker_addr.strip()]
    assert cluster is not None
    return await cluster_brokers(client, cluster.strip(), slaves=slaves)


# ---------------------------------------------------------------------------- requests
async def create_access_config(client: AdminClient, addr: str, fields: dict[str, Any]) -> None:
    """UPDATE_AND_CREATE_ACL_CONFIG (CreateAccessConfigRequestHeader fields)."""
    await client.call(addr, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, fields)


async def delete_access_config(client: AdminClient, addr: str, access_key: str) -> None:
    """DELETE_ACL_CONFIG."""
    await client.call(addr, RequestCode.DELETE_ACL_CONFIG, {"accessKey": access_key})


async def update_global_white_addrs(client: AdminClient, addr: str, addrs: str, acl_file: str | None) -> None:
    """UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (``aclFileFullPath`` only when given, as mqadmin)."""
    fields = {"globalWhiteAddrs": addrs}
    if acl_file:
        fields["aclFileFullPath"] = acl_file
    await client.call(addr, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, fields)


def _json(text: Any, what: str, addr: str) -> Any:
    try:
        return loads_lenient(text) if text else None  # fastjson may write bare integer keys
    except (ValueError, TypeError):
        raise AdminError(
            f"{addr} answered {what} with a field that is not JSON: {str(text)[:80]!r}"
        ) from None


async def acl_version_info(client: AdminClient, addr: str) -> dict[str, Any]:
    """GET_BROKER_CLUSTER_ACL_INFO as RocketMQ's ClusterAclVersionInfo: clusterName, brokerName,
    brokerAddr, aclConfigDataVersion and allAclConfigDataVersion (file -> {counter, timestamp})."""
    resp = await client.call(addr, RequestCode.GET_BROKER_CLUSTER_ACL_INFO)
    f = resp.ext_fields or {}
    versions = _json(f.get("allAclFileVersion"), "GET_BROKER_CLUSTER_ACL_INFO", addr) or {}
    if not isinstance(versions, dict) or not all(isinstance(v, dict) for v in versions.values()):
        raise AdminError(f"{addr} answered GET_BROKER_CLUSTER_ACL_INFO with an unreadable allAclFileVersion")
    return {
        "clusterName": f.get("clusterName", ""),
        "brokerName": f.get("brokerName", ""),
        "brokerAddr": f.get("brokerAddr", addr),
        "aclConfigDataVersion": _json(f.get("version"), "GET_BROKER_CLUSTER_ACL_INFO", addr),
        "allAclConfigDataVersion": versions,
    }


async def acl_config(client: AdminClient, addr: str) -> dict[str, Any]:
    """GET_BROKER_CLUSTER_ACL_CONFIG: {globalWhiteAddrs, plainAccessConfigs}."""
    resp = await client.call(addr, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG)
    body = _json(resp.payload(), "GET_BROKER_CLUSTER_ACL_CONFIG", addr)
    if not isinstance(body, dict) or not isinstance(body.get("plainAccessConfigs") or [], list):
        raise AdminError(f"{addr} answered GET_BROKER_CLUSTER_ACL_CONFIG with an unreadable body")
    return body


# ---------------------------------------------------------------------------- commands
@admin.command("updateAclConfig")
@click.option("-b", "--brokerAddr", "broker_addr", help="Update the ACL file of this broker (host:port).")
@click.option(
    "-c",
    "--clusterName",
    "cluster",
    help="Update the ACL files of every broker (masters and slaves) of this cluster.",
)
@click.option(
    "-a", "--accessKey", "account_key", required=True, help="The account's accessKey (at least 7 characters)."
)
@click.option(
    "-s",
    "--secretKey",
    "account_secret",
    required=True,
    help="The account's secretKey (at least 7 characters).",
)
@click.option(
    "-w", "--whiteRemoteAddress", "white", help="Addresses that need no signature for this account."
)
@click.option(
    "-i", "--defaultTopicPerm", "default_topic_perm", help="PUB, SUB, PUB|SUB or DENY for unlisted topics."
)
@click.option(
    "-u", "--defaultGroupPerm", "default_group_perm", help="PUB, SUB, PUB|SUB or DENY for unlisted groups."
)
@click.option(
    "-t", "--topicPerms", "topic_perms", help="topicA=DENY,topicD=SUB (replaces the account's list)."
)
@click.option(
    "-g", "--groupPerms", "group_perms", help="groupA=DENY,groupD=SUB (replaces the account's list)."
)
@click.option(
    "-m", "--admin", "admin_flag", help="true: an admin account (anything else: not; mqadmin's rule)."
)
@_run
async def update_acl_config(
    client: AdminClient,
    broker_addr: str | None,
    cluster: str | None,
    account_key: str,
    account_secret: str,
    white: str | None,
    default_topic_perm: str | None,
    default_group_perm: str | None,
    topic_perms: str | None,
    group_perms: str | None,
    admin_flag: str | None,
) -> None:
    """Create an ACL account or update it (keys not given keep their values; admin is always set)."""
    _one_target(broker_addr, cluster)
    is_admin = (admin_flag or "").strip().lower() == "true"  # Boolean.parseBoolean
    fields: dict[str, Any] = {
        "accessKey": account_key.strip(),
        "secretKey": account_secret.strip(),
        "admin": is_admin,
    }
    for key, value in (
        ("whiteRemoteAddress", white),
        ("defaultTopicPerm", default_topic_perm),
        ("defaultGroupPerm", default_group_perm),
        ("topicPerms", topic_perms),
        ("groupPerms", group_perms),
    ):
        if value is not None:
            fields[key] = value.strip()
    for addr in await _targets(client, broker_addr, cluster, slaves=True):
        await create_access_config(client, addr, fields)
        click.echo(f"create or update plain access config to {addr} success.")
    shown = ", ".join(f"{k}={_java_str(v)}" for k, v in fields.items() if k != "secretKey")
    click.echo(f"PlainAccessConfig{{{shown}}}")


@admin.command("deleteAclConfig")
@click.option("-b", "--brokerAddr", "broker_addr", help="Delete the account from this broker (host:port).")
@click.option("-c", "--clusterName", "cluster", help="Delete the account from every broker of this cluster.")
@click.option(
    "-a", "--accessKey", "account_key", required=True, help="The accessKey of the account to delete."
)
@_run
async def delete_acl_config(
    client: AdminClient, broker_addr: str | None, cluster: str | None, account_key: str
) -> None:
    """Delete an ACL account."""
    _one_target(broker_addr, cluster)
    access_key = account_key.strip()
    for addr in await _targets(client, broker_addr, cluster, slaves=True):
        await delete_access_config(client, addr, access_key)
        click.echo(f"delete plain access config account from {addr} success.")
    click.echo(f"account's accesskey is:{access_key}")


@admin.command("updateGlobalWhiteAddr")
@click.option("-b", "--brokerAddr", "broker_addr", help="Update this broker (host:port).")
@click.option("-c", "--clusterName", "cluster", help="Update every broker of this cluster.")
@click.option(
    "-g",
    "--globalWhiteRemoteAddresses",
    "addresses",
    required=True,
    help="Address patterns, e.g. 10.10.103.*,192.168.0.* (replaces the list; '' empties it).",
)
@click.option(
    "-p", "--aclFileFullPath", "acl_file", help="The broker's ACL file (checked against the broker's)."
)
@_run
async def update_global_white_addr(
    client: AdminClient, broker_addr: str | None, cluster: str | None, addresses: str, acl_file: str | None
) -> None:
    """Replace the ACL file's globalWhiteRemoteAddresses."""
    _one_target(broker_addr, cluster)
    for addr in await _targets(client, broker_addr, cluster, slaves=True):
        await update_global_white_addrs(
            client, addr, addresses.strip(), acl_file.strip() if acl_file else None
        )
        click.echo(f"update global white remote addresses to {addr} success.")


_VERSION_ROW = "{:<16}  {:<22}  {:<22}  {:<20}  {:<22}  {:<22}"


def _print_versions(info: dict[str, Any]) -> None:
    for path, version in info["allAclConfigDataVersion"].items():
        try:
            stamp = int(version.get("timestamp") or 0)
        except (TypeError, ValueError):
            raise AdminError(
                f"{info['brokerAddr']} answered an ACL version whose timestamp is not a number"
            ) from None
        click.echo(
            _VERSION_ROW.format(
                info["clusterName"],
                info["brokerName"],
                info["brokerAddr"],
                path,
                str(version.get("counter", 0)),
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp / 1000)),
            ).rstrip()
        )


@admin.command("clusterAclConfigVersion")
@click.option("-b", "--brokerAddr", "broker_addr", help="Query this broker (host:port).")
@click.option("-c", "--clusterName", "cluster", help="Query every master of this cluster.")
@_run
async def cluster_acl_config_version(
    client: AdminClient, broker_addr: str | None, cluster: str | None
) -> None:
    """List the ACL file version of brokers: counter and last update time."""
    _one_target(broker_addr, cluster)
    if broker_addr:
        _print_versions(await acl_version_info(client, broker_addr.strip()))
        click.echo("get broker's plain access config version success.")
        return
    addrs = await _targets(client, None, cluster, slaves=False)
    click.echo(
        _VERSION_ROW.format(
            "#Cluster Name",
            "#Broker Name",
            "#Broker Addr",
            "#AclFilePath",
            "#AclConfigVersionNum",
            "#AclLastUpdateTime",
        ).rstrip()
    )
    for addr in addrs:
        _print_versions(await acl_version_info(client, addr))
    click.echo("get cluster's plain access config version success.")


_ACCOUNT_FIELDS = (
    "accessKey",
    "secretKey",
    "whiteRemoteAddress",
    "admin",
    "defaultTopicPerm",
    "defaultGroupPerm",
    "topicPerms",
    "groupPerms",
)


def _java_str(value: Any) -> str:
    """A value as Java's toString prints it (lists ``[a, b]``, booleans ``true``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_java_str(v) for v in value) + "]"
    return str(value)


@admin.command("getAclConfig")
@click.option("-b", "--brokerAddr", "broker_addr", help="Query this broker (host:port).")
@click.option("-c", "--clusterName", "cluster", help="Query every master of this cluster.")
@_run
async def get_acl_config(client: AdminClient, broker_addr: str | None, cluster: str | None) -> None:
    """Print the brokers' ACL files: global white addresses and every account (secret keys included)."""
    _one_target(broker_addr, cluster)
    for addr in await _targets(client, broker_addr, cluster, slaves=False):
        config = await acl_config(client, addr)
        click.echo("")
        click.echo(f"{'globalWhiteRemoteAddresses':<20}: {_java_str(config.get('globalWhiteAddrs') or [])}")
        click.echo("")
        click.echo("accounts:")
        for account in config.get("plainAccessConfigs") or []:
            if not isinstance(account, dict):
                raise AdminError(
                    f"{addr} answered GET_BROKER_CLUSTER_ACL_CONFIG with an account that is not an object"
                )
            for name in _ACCOUNT_FIELDS:
                value = account.get(name, False if name == "admin" else None)
                click.echo(f"  {name:<18}: {_java_str(value)}")
            click.echo("")
