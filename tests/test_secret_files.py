"""Secrets and files (issue 41 item 7), seen as a local user or a log reader would.

Security review M3, L1, L2: a remote ACL edit turned a 0600 ``plain_acl.yml`` into 0644; a
malformed ``plain_acl.yml`` printed a secret key in the ERROR log and in ``check-config``; the
data directory was 0755 and its files 0644, so any local user read every message; the HA secret
file's mode was never checked (tests/test_protected_mode.py covers that one).
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tidemq.datadir import lock_data_dir
from tidemq.jsonfile import atomic_write_bytes
from tidemq_acl.validator import PlainAccessValidator

pytestmark = pytest.mark.timeout(120)

SECRET = "ops-admin-secret-XYZ"
ACL = f"""\
accounts:
  - accessKey: ops-admin
    secretKey: {SECRET}
    admin: true
"""
BROKEN = f"accounts:\n  - accessKey: ops-admin\n    secretKey: {SECRET}: [oops\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", *args], capture_output=True, text=True, timeout=60
    )


def test_malformed_acl_file_never_shows_its_secret(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(BROKEN)
    acl.chmod(0o600)
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'[broker]\ndata_dir = "{tmp_path / "d"}"\n[plugins]\nacl = "plain"\n[acl.plain]\nfile = "{acl}"\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "check-config", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "not valid YAML at line 3, column" in out.stderr, out.stderr
    assert SECRET not in out.stdout + out.stderr
    # The same mistake made while the broker runs: logged, the accounts in force stay, no secret.
    acl.write_text(ACL)
    validator = PlainAccessValidator(acl, reload_check_s=0.01)
    acl.write_text(BROKEN + "# changed\n")
    with caplog.at_level(logging.ERROR):
        assert not validator.maybe_reload(time.monotonic() + 1)
    assert "not valid YAML at line 3" in caplog.text and SECRET not in caplog.text


def test_remote_acl_edit_keeps_the_file_private(spawn: Any, tmp_path: Path, port: int) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    acl.chmod(0o600)
    namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'[broker]\nlisten = "127.0.0.1:{port}"\nnamesrv = ["{namesrv}"]\ndata_dir = "{tmp_path / "d"}"\n'
        f'[plugins]\nacl = "plain"\n[acl.plain]\nfile = "{acl}"\n'
    )
    broker = spawn("broker", "-c", str(cfg)).addresses["broker"]
    old = os.umask(0o022)  # the usual umask, whatever this process's is
    try:
        edit = admin(
            "updateAclConfig", "-b", broker, "-n", namesrv, "-a", "new-user-key", "-s", "new-user-secret",
            "--access-key", "ops-admin", "--secret-key", SECRET,
        )  # fmt: skip
    finally:
        os.umask(old)
    assert edit.returncode == 0, edit.stderr
    assert "new-user-key" in acl.read_text()
    assert mode(acl) == 0o600  # was 0644 after the edit


def test_replaced_files_keep_their_mode_and_new_ones_take_the_given_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        kept = tmp_path / "kept.json"
        kept.write_text("{}")
        kept.chmod(0o640)
        atomic_write_bytes(kept, b"[]")
        assert mode(kept) == 0o640 and kept.read_bytes() == b"[]"
        new = tmp_path / "new.yml"
        atomic_write_bytes(new, b"x", mode=0o600)
        assert mode(new) == 0o600
        plain = tmp_path / "plain.json"
        atomic_write_bytes(plain, b"x")
        assert mode(plain) == 0o644  # no mode asked: the umask's, as before
    finally:
        os.umask(old)


def test_locked_data_directory_is_private(tmp_path: Path) -> None:
    fresh, existing = tmp_path / "fresh", tmp_path / "existing"
    existing.mkdir(mode=0o755)
    existing.chmod(0o755)
    for root in (fresh, existing):
        with lock_data_dir(root, "test"):
            assert mode(root) == 0o700, root
            assert mode(root / "lock") == 0o600
    wider = tmp_path / "wider"
    with lock_data_dir(wider, "test", mode=0o750):
        assert mode(wider) == 0o750
    shared = tmp_path / "shared"  # a data_dir naming a directory of other things: warned, not changed
    shared.mkdir()
    shared.chmod(0o755)
    (shared / "someone-else.txt").write_text("x")
    with lock_data_dir(shared, "test"):
        assert mode(shared) == 0o755


def test_a_broker_writes_its_data_for_its_owner_only(spawn: Any, tmp_path: Path, port: int) -> None:
    namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
    data = tmp_path / "data"
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'[broker]\nlisten = "127.0.0.1:{port}"\nnamesrv = ["{namesrv}"]\ndata_dir = "{data}"\n')
    broker = spawn("broker", "-c", str(cfg)).addresses["broker"]
    assert admin("updateTopic", "-b", broker, "-n", namesrv, "-t", "Secrets").returncode == 0
    assert admin("sendMessage", "-n", namesrv, "-t", "Secrets", "-p", "ssn=123-45-6789").returncode == 0
    assert mode(data) == 0o700
    files = [p for p in data.rglob("*") if p.is_file()]
    assert any("commitlog" in str(p) for p in files), files
    loose = {str(p.relative_to(data)): oct(mode(p)) for p in files if mode(p) & 0o077}
    assert not loose, loose  # was 0644 for the commit log, consume queues, config/*.json and lock
    dirs = {str(p.relative_to(data)): oct(mode(p)) for p in data.rglob("*") if p.is_dir() and mode(p) & 0o077}
    assert not dirs, dirs
