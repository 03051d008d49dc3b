"""TLS verification (issue 41 item 8): with a CA, a client checks the server's name by default.

Security review M4: with ``tls_cafile`` a certificate for CN=evil.example, signed by the same CA,
was accepted for 127.0.0.1, so any node (or anyone holding one node's key) could impersonate any
other.  Certificates are made here with the ``openssl`` command.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tidemq.plugins import get_plugin_manager
from tidemq.remoting import RemotingCommand
from tidemq.remoting.errors import RemotingError
from tidemq_transport_tcp import run

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certs(d: Path) -> dict[str, Path]:
    """A CA, a certificate for 127.0.0.1 and one for evil.example, both signed by it."""
    out = {"ca": d / "ca.crt", "ca_key": d / "ca.key"}
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(out["ca_key"]),
             "-out", str(out["ca"]), "-days", "1", "-subj", "/CN=test-ca")  # fmt: skip
    for name, san in (("good", "IP:127.0.0.1"), ("evil", "DNS:evil.example")):
        key, csr, crt, ext = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt", d / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\n")
        cn = "127.0.0.1" if name == "good" else "evil.example"
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            f"/CN={cn}",
        )
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(out["ca"]), "-CAkey", str(out["ca_key"]),
                 "-CAcreateserial", "-out", str(crt), "-days", "1", "-extfile", str(ext))  # fmt: skip
        out[name], out[f"{name}_key"] = crt, key
    return out


def transport(**options: Any) -> Any:
    return get_plugin_manager().create("transport", "tcp", options=options)


async def echo(conn: Any, req: RemotingCommand) -> RemotingCommand:
    return req.reply(body=req.body)


def talk(server_cert: Path, server_key: Path, **client: Any) -> bytes:
    async def main() -> bytes:
        server = transport(tls=True, tls_certfile=str(server_cert), tls_keyfile=str(server_key)).server(
            "127.0.0.1", 0, echo
        )
        await server.start()
        c = transport(tls=True, **client).client()
        try:
            host, port = server.address
            resp = await c.invoke(f"{host}:{port}", RemotingCommand.request(10, {}, b"secret"), 3)
            return bytes(resp.body or b"")
        finally:
            await c.close()
            await server.stop()

    return bytes(run(main()))


def test_a_certificate_for_another_name_is_refused_by_default(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    assert talk(certs["good"], certs["good_key"], tls_cafile=str(certs["ca"])) == b"secret"
    with pytest.raises(RemotingError) as err:  # before: accepted, the impersonator got b"secret"
        talk(certs["evil"], certs["evil_key"], tls_cafile=str(certs["ca"]))
    assert "certificate" in str(err.value).lower() or "CERTIFICATE_VERIFY_FAILED" in str(err.value)


def test_tls_without_verification_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    certs = make_certs(tmp_path)
    with caplog.at_level(logging.WARNING, logger="tidemq_transport_tcp.options"):
        assert talk(certs["evil"], certs["evil_key"], tls_cafile=str(certs["ca"]), tls_check_hostname=False)
        assert talk(certs["evil"], certs["evil_key"]) == b"secret"  # no CA: encryption only
    text = caplog.text
    assert "tls_check_hostname = false: any certificate signed by" in text
    assert "TLS client without tls_cafile: the server is not verified" in text
