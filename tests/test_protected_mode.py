"""Protected mode: a listener beyond loopback without authentication refuses to start (issue 41 item 1).

Security review C1/C2: once the operations guide's ``0.0.0.0`` was followed, the NameServer and
the HA port let anyone reroute producers and read every message.  Each listener now refuses, with
one line naming the fix, unless its table says ``insecure = true``; ``tidemq check-config`` says
the same, and prints a ``warning:`` line for each listener left open on purpose.  The broker's
signed registrations reach a NameServer that checks them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

from tidemq.config import check_broker, load_config
from tidemq.errors import ConfigError
from tidemq.protected import is_loopback

pytestmark = pytest.mark.timeout(120)

ACL = """\
accounts:
  - accessKey: broker-ns-key
    secretKey: broker-ns-secret-123
    admin: true
"""


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def broker_toml(tmp_path: Path, *extra: str, listen: str = "0.0.0.0:10911") -> Path:
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        "\n".join(
            [
                "[broker]",
                f'listen = "{listen}"',
                'advertise = "203.0.113.7:10911"',  # no routable address needed on the test machine
                f'data_dir = "{tmp_path / "data"}"',
                *extra,
            ]
        )
        + "\n"
    )
    return cfg


def test_loopback_hosts() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "10.0.0.1", "203.0.113.7", "broker-a.example"):
        assert not is_loopback(host), host


def test_broker_beyond_loopback_without_acl_refuses(tmp_path: Path) -> None:
    out = check_config(broker_toml(tmp_path))
    assert out.returncode == 2, out.stdout
    line = out.stderr.strip().splitlines()[-1]
    assert (
        line.startswith("tidemq: error:")
        and "protected mode: the broker broker-a would listen on 0.0.0.0" in line
    )
    assert '[plugins] acl = "plain"' in line and "[broker] insecure = true" in line
    opened = check_config(broker_toml(tmp_path, "insecure = true"))
    assert opened.returncode == 0, opened.stderr
    assert "warning: insecure: the broker broker-a listens on 0.0.0.0 without authentication" in opened.stdout
    acl = private(tmp_path / "plain_acl.yml", ACL)
    protected = check_config(
        broker_toml(tmp_path, "[plugins]", 'acl = "plain"', "[acl.plain]", f'file = "{acl}"')
    )
    assert protected.returncode == 0, protected.stderr
    assert "warning" not in protected.stdout
    assert (
        check_config(broker_toml(tmp_path, listen="127.0.0.1:10911")).returncode == 0
    )  # loopback: as before


def test_ha_port_beyond_loopback_without_secret_refuses(tmp_path: Path) -> None:
    base = ["insecure = true", "[plugins]", 'replication = "master_slave"', "[replication.master_slave]"]
    with pytest.raises(
        ConfigError, match=r"protected mode: the HA port of broker broker-a would listen on 0\.0\.0\.0"
    ) as err:
        check_broker(load_config(broker_toml(tmp_path, *base)))
    assert "set secret_file in [replication.master_slave]" in str(err.value)
    assert "[replication.master_slave] insecure = true" in str(err.value)
    secret = private(tmp_path / "ha.secret", "a-shared-secret-of-32-characters")
    check_broker(load_config(broker_toml(tmp_path, *base, f'secret_file = "{secret}"')))
    check_broker(load_config(broker_toml(tmp_path, *base, 'listen = "127.0.0.1:10912"')))  # HA on loopback
    check_broker(load_config(broker_toml(tmp_path, *base, "insecure = true")))
    # A slave of master_slave does not listen: nothing to protect.
    slave = ["insecure = true", 'role = "SLAVE"', "id = 1", *base[1:]]
    check_broker(load_config(broker_toml(tmp_path, *slave)))
    # A world-readable secret is refused as ssh refuses such keys.
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match=r"HA secret file .* is readable by others \(mode 0644\)"):
        check_broker(load_config(broker_toml(tmp_path, *base, f'secret_file = "{secret}"')))


def test_controller_replicas_all_listen_so_all_are_checked(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    cfg = broker_toml(
        tmp_path,
        "insecure = true",
        "id = 1",
        "[plugins]",
        'replication = "controller"',
        "[replication.controller]",
        'etcd = ["http://127.0.0.1:1"]',
    )
    with pytest.raises(ConfigError, match=r"HA port .* set secret_file in \[replication\.controller\]"):
        check_broker(load_config(cfg))


def test_namesrv_beyond_loopback_without_credentials_refuses(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "namesrv", "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    line = out.stderr.strip().splitlines()[-1]
    assert "protected mode: the NameServer would listen on 0.0.0.0" in line
    assert "[namesrv] credentials_file" in line and "[namesrv] insecure = true" in line
    cfg = tmp_path / "ns.toml"
    cfg.write_text('[namesrv]\nlisten = "0.0.0.0:9876"\n')
    assert "protected mode: the NameServer" in check_config(cfg).stderr
    cfg.write_text('[namesrv]\nlisten = "0.0.0.0:9876"\ninsecure = true\n')
    assert "warning: insecure: the NameServer listens on 0.0.0.0" in check_config(cfg).stdout
    creds = private(tmp_path / "ns_acl.yml", ACL)
    cfg.write_text(f'[namesrv]\nlisten = "0.0.0.0:9876"\ncredentials_file = "{creds}"\n')
    assert check_config(cfg).returncode == 0
    creds.chmod(0o640)
    refused = check_config(cfg)
    assert refused.returncode == 2 and "is readable by others (mode 0640)" in refused.stderr


def test_broker_signs_its_registration_for_an_authenticated_namesrv(spawn: Any, tmp_path: Path) -> None:
    creds = private(tmp_path / "ns_acl.yml", ACL)
    ns_toml = tmp_path / "ns.toml"
    ns_toml.write_text(f'[namesrv]\nlisten = "127.0.0.1:0"\ncredentials_file = "{creds}"\n')
    namesrv = spawn("namesrv", "-c", str(ns_toml)).addresses["namesrv"]
    secret = private(tmp_path / "ns.secret", "broker-ns-secret-123\n")

    def broker(name: str, *extra: str) -> Any:
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(
            f'[broker]\nname = "{name}"\nlisten = "127.0.0.1:0"\nnamesrv = ["{namesrv}"]\n'
            f'data_dir = "{tmp_path / name}"\n' + "".join(f"{line}\n" for line in extra)
        )
        return spawn("broker", "-c", str(cfg))

    signed = broker("broker-signed", 'access_key = "broker-ns-key"', f'secret_key_file = "{secret}"')
    unsigned = broker("broker-unsigned")

    def clusters() -> str:
        out = subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", "clusterList", "-n", namesrv],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout

    assert wait_for(lambda: "broker-signed" in clusters(), 20)
    time.sleep(0.5)
    assert "broker-unsigned" not in clusters()
    log = unsigned.log_path.read_text()
    assert f"NameServer {namesrv} refused registration: 16" in log and "needs a signature" in log
    assert "refused" not in signed.log_path.read_text()


def test_standalone_broker_beyond_loopback_without_acl_refuses(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "standalone", "--data-dir", str(tmp_path / "sa"),
         "--namesrv-listen", "127.0.0.1:0", "--broker-listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert (
        "protected mode: the broker broker-a would listen on 0.0.0.0" in out.stderr.strip().splitlines()[-1]
    )
