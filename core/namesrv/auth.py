"""NameServer authentication: writes must carry RocketMQ's ACL signature of a trusted account.

RocketMQ 4.x's NameServer checks nothing: anyone who reaches it registers a broker (and so
receives producers' messages), erases routes or changes its expiry.  With ``[namesrv]
credentials_file`` set, tidemq's NameServer verifies every *write* as the broker's ``plain`` ACL
verifies requests: ``AccessKey`` names an account, ``Signature`` is ``base64(HmacSHA1(secretKey,
sorted ext field values + body))`` (:mod:`tidemq.acl`).  Only accounts with ``admin: true`` are
trusted, so the brokers' ``plain_acl.yml`` can serve as the file as it is.  Reads (routes, cluster
and topic lists, KV and config reads) stay unsigned: RocketMQ's clients send them unsigned.

The file is RocketMQ's ``plain_acl.yml`` format (other keys are ignored here)::

    accounts:
      - accessKey: broker-a-ns
        secretKey: a-long-random-secret
        admin: true

It holds secrets, so it must be private to its owner (mode 0600, :mod:`tidemq.secretfile`).
A request is never refused for its IP address alone (no white lists): the signature is the proof.
"""

from __future__ import annotations

import logging
from pathlib import Path

import attrs

from tidemq.acl import ACCESS_KEY, SIGNATURE, verify_signature
from tidemq.errors import ConfigError
from tidemq.remoting import RemotingCommand, RequestCode
from tidemq.secretfile import private_mode_problem

log = logging.getLogger(__name__)

#: Requests that change what the NameServer serves: refused unless signed by a trusted account.
#: QUERY_DATA_VERSION is here too: it renews a registered broker's lease.
WRITE_CODES: frozenset[int] = frozenset(
    {
        RequestCode.PUT_KV_CONFIG,
        RequestCode.DELETE_KV_CONFIG,
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.QUERY_DATA_VERSION,
        RequestCode.WIPE_WRITE_PERM_OF_BROKER,
        RequestCode.ADD_WRITE_PERM_OF_BROKER,
        RequestCode.DELETE_TOPIC_IN_NAMESRV,
        RequestCode.REGISTER_TOPIC_IN_NAMESRV,
        RequestCode.UPDATE_NAMESRV_CONFIG,
    }
)
#: RocketMQ's minimum key length (AclConstants.ACCESS_KEY_MIN_LENGTH + 1), as plain_acl.yml.
MIN_KEY_LENGTH = 7


@attrs.frozen
class NamesrvAuth:
    """The accounts trusted to write: access key -> secret key."""

    path: str
    secrets: dict[str, str] = attrs.field(repr=False)  # never in logs or reprs

    def refusal(self, request: RemotingCommand) -> str | None:
        """Why ``request`` may not run (one line, no secret), or None when it may."""
        if request.code not in WRITE_CODES:
            return None
        fields = request.ext_fields or {}
        access_key = fields.get(ACCESS_KEY)
        if not access_key:
            return f"request code {request.code} changes the NameServer and needs a signature (AccessKey is missing)"
        secret = self.secrets.get(access_key)
        if secret is None:
            return f"accessKey {access_key} is not an admin account of this NameServer"
        if SIGNATURE not in fields or not verify_signature(request, secret):
            return f"signature check failed for accessKey {access_key}"
        return None


def load_namesrv_auth(path: str) -> NamesrvAuth:
    """Read ``[namesrv] credentials_file``; every problem is one ConfigError line naming no secret."""
    option = "[namesrv] credentials_file"
    p = Path(path).expanduser()
    problem = private_mode_problem(p, "credentials file")
    if problem:
        raise ConfigError(f"{option}: {problem}")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{option} = {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{option} = {path!r}: cannot read it: {exc}") from None
    import yaml  # here: a process that reads no such file does not hold PyYAML (docs/operations.md, "Memory")

    try:
        data = yaml.load(text, Loader=yaml.BaseLoader)  # every scalar a string, as plain_acl.yml
    except yaml.YAMLError as exc:
        # Only where: the message of a YAML error quotes the line, which may hold a secret.
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{option} = {path!r}: not valid YAML{at}") from None
    accounts = data.get("accounts") if isinstance(data, dict) else None
    if not isinstance(accounts, list):
        raise ConfigError(f"{option} = {path!r}: expected an 'accounts' list of accessKey/secretKey/admin")
    secrets: dict[str, str] = {}
    for i, raw in enumerate(accounts):
        if not isinstance(raw, dict):
            raise ConfigError(f"{option} = {path!r}: accounts[{i}] is not a mapping")
        ak, sk = raw.get("accessKey"), raw.get("secretKey")
        if not isinstance(ak, str) or len(ak) < MIN_KEY_LENGTH:
            raise ConfigError(
                f"{option} = {path!r}: accounts[{i}]: accessKey must be at least {MIN_KEY_LENGTH} characters"
            )
        if not isinstance(sk, str) or len(sk) < MIN_KEY_LENGTH:
            raise ConfigError(
                f"{option} = {path!r}: accounts[{i}] (accessKey {ak}): secretKey must be at least "
                f"{MIN_KEY_LENGTH} characters"
            )
        if str(raw.get("admin", "false")).strip().lower() == "true":
            secrets[ak] = sk
    if not secrets:
        raise ConfigError(
            f"{option} = {path!r}: no account has admin: true, so nothing could register with this NameServer"
        )
    return NamesrvAuth(str(p), secrets)


__all__ = ["WRITE_CODES", "NamesrvAuth", "load_namesrv_auth"]
