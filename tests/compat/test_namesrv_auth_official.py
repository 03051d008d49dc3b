"""The official client (``rocketmq==0.4.4``) through a NameServer that authenticates writes.

One ``plain_acl.yml`` serves the broker's ACL and the NameServer's ``credentials_file``; the broker
signs its registrations with the admin account.  The official client, unchanged, finds the broker
(its route reads are not checked), sends and consumes; ``tidemq admin`` changes the NameServer
only when signed by the admin account.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).with_name("test_acl_official.py")  # produce|push with --ak/--sk
KNOWN_CLIENT_SHUTDOWN_ABORT = "boost::thread_interrupted"

ACL = """\
accounts:
  - accessKey: compat-ak
    secretKey: compat-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - NsAuthCompat=PUB|SUB
    groupPerms:
      - ACL_COMPAT_PG=PUB
      - ACL_COMPAT_CG=SUB
  - accessKey: compat-admin
    secretKey: compat-admin-secret
    admin: true
"""
ADMIN_KEYS = ("--access-key", "compat-admin", "--secret-key", "compat-admin-secret")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(240)]


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def admin(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", *args, "-n", namesrv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_official_client_through_an_authenticated_namesrv(spawn: Any, tmp_path: Path) -> None:
    pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")
    acl = private(tmp_path / "plain_acl.yml", ACL)
    secret = private(tmp_path / "ns.secret", "compat-admin-secret\n")
    (tmp_path / "ns.toml").write_text(f'[namesrv]\nlisten = "127.0.0.1:0"\ncredentials_file = "{acl}"\n')
    namesrv = spawn("namesrv", "-c", str(tmp_path / "ns.toml")).addresses["namesrv"]
    from conftest import free_port

    (tmp_path / "broker.toml").write_text(
        "[broker]\n"
        'name = "broker-ns-auth"\n'
        f'listen = "127.0.0.1:{free_port()}"\n'
        f'namesrv = ["{namesrv}"]\n'
        f'data_dir = "{tmp_path / "data"}"\n'
        'access_key = "compat-admin"\n'
        f'secret_key_file = "{secret}"\n'
        '[plugins]\nacl = "plain"\n'
        f'[acl.plain]\nfile = "{acl}"\n'
    )
    broker = spawn("broker", "-c", str(tmp_path / "broker.toml")).addresses["broker"]
    made = admin(
        namesrv, "updateTopic", "-t", "NsAuthCompat", "-r", "2", "-w", "2", "-b", broker, *ADMIN_KEYS
    )
    assert made.returncode == 0, made.stderr

    def run(*args: str) -> list[dict[str, Any]]:
        out = subprocess.run(
            [
                sys.executable,
                str(WORKER),
                *args,
                "--namesrv",
                namesrv,
                "--ak",
                "compat-ak",
                "--sk",
                "compat-secret",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            env={**os.environ, "HOME": str(tmp_path)},  # the C++ client writes ~/logs/rocketmq-cpp
            cwd=tmp_path,
        )
        ok = out.returncode == 0 or (out.returncode == -6 and KNOWN_CLIENT_SHUTDOWN_ABORT in out.stderr)
        assert ok, out.stderr[-3000:]
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]

    sent = run("produce", "--topic", "NsAuthCompat", "--count", "3")
    assert [r.get("status") for r in sent] == [0] * 3, sent
    got = run("push", "--topic", "NsAuthCompat", "--group", "ACL_COMPAT_CG", "--count", "3")
    assert got[-1]["complete"] and got[-1]["received"] == [f"acl-{i}" for i in range(3)]
    # NameServer writes through tidemq admin: refused unsigned, done when signed by the admin.
    unsigned = admin(namesrv, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "false")
    assert unsigned.returncode != 0 and "needs a signature" in unsigned.stderr
    signed = admin(namesrv, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "false", *ADMIN_KEYS)
    assert signed.returncode == 0, signed.stderr
