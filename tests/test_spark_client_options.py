"""The ``tidemq`` source's and sink's client passthrough (ACL keys, TLS) and the sink's Kafka
options, parsed without Spark: names, aliases, clear errors, and the secret kept out of sight."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tidemq.client import SessionCredentials
from tidemq_spark.client_options import ClientOptions
from tidemq_spark.options import TidemqSparkError
from tidemq_spark.sink_options import SinkOptions
from tidemq_spark.source_options import SourceOptions

SECRET = "s3cr3t-never-shown"


def test_no_options_means_no_credentials_and_plain_tcp() -> None:
    opts = ClientOptions.parse({"namesrv": "h:1"})
    assert opts.credentials is None
    assert dict(opts.transport_options) == {}
    assert opts.describe() == "no accessKey/secretKey options, tls off"


@pytest.mark.parametrize(
    "names",
    [
        ("accessKey", "secretKey", "securityToken"),
        ("access.key", "secret.key", "security.token"),  # RocketMQ Flink connector, console
        ("AccessKey", "SecretKey", "SecurityToken"),  # ONS PropertyKeyConst
        ("ACCESSKEY", "secretkey", "SecurityTOKEN"),  # plain dicts too are read case-insensitively
    ],
)
def test_credentials_under_each_spelling(names: tuple[str, str, str]) -> None:
    ak, sk, token = names
    opts = ClientOptions.parse({ak: "spark-ak", sk: SECRET, token: "tok"})
    creds = opts.credentials
    assert isinstance(creds, SessionCredentials)
    assert (creds.access_key, creds.secret_key, creds.security_token) == ("spark-ak", SECRET, "tok")


def test_the_secret_never_shows_in_reprs_or_descriptions() -> None:
    raw = {"namesrv": "h:1", "accessKey": "spark-ak", "secretKey": SECRET, "securityToken": "tok-hidden"}
    for shown in (
        repr(ClientOptions.parse(raw)),
        str(ClientOptions.parse(raw)),
        ClientOptions.parse(raw).describe(),
        repr(SinkOptions.parse(raw)),
        repr(SourceOptions.parse({**raw, "topic": "T"}, streaming=False)),
        repr(ClientOptions.parse(raw).credentials),
    ):
        assert "spark-ak" in shown or "SessionCredentials" in shown
        assert SECRET not in shown and "tok-hidden" not in shown


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"accessKey": "ak"}, "option accessKey needs option secretKey too"),
        ({"secretKey": SECRET}, "option secretKey needs option accessKey too"),
        ({"securityToken": "t"}, "option securityToken needs accessKey and secretKey"),
        ({"accessKey": "ak", "secretKey": SECRET, "secret.key": SECRET + "x"}, "are aliases but differ"),
        ({"tls": "maybe"}, "option tls = 'maybe' is not true or false"),
        ({"tls.cafile": "/nonexistent/ca.pem", "tls": "true"}, "option tls.cafile = '/nonexistent/ca.pem'"),
    ],
)
def test_bad_client_options_fail_with_one_line_naming_the_option(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(TidemqSparkError, match="^[^\n]*$") as err:
        ClientOptions.parse(options)
    assert message in str(err.value)
    assert SECRET not in str(err.value)


def test_tls_options_map_to_the_tcp_transport_keys(tmp_path: Path) -> None:
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "cert", "key")}
    for f in files.values():
        f.write_text("-----BEGIN CERTIFICATE-----\n")
    opts = ClientOptions.parse(
        {
            "tls": "true",
            "tls.cafile": str(files["ca"]),
            "tls.certfile": str(files["cert"]),
            "tls_keyfile": str(files["key"]),  # the [transport.tcp] spelling is an alias
            "tls.checkHostname": "true",
        }
    )
    assert dict(opts.transport_options) == {
        "tls": True,
        "tls_cafile": str(files["ca"]),
        "tls_certfile": str(files["cert"]),
        "tls_keyfile": str(files["key"]),
        "tls_check_hostname": True,
    }
    assert opts.describe().endswith("tls on")
    assert dict(ClientOptions.parse({"tls": "true"}).transport_options) == {"tls": True}
    with pytest.raises(TidemqSparkError, match="need tls=true"):
        ClientOptions.parse({"tls.cafile": str(files["ca"])})
    with pytest.raises(TidemqSparkError, match="tls.certfile needs tls.keyfile"):
        ClientOptions.parse({"tls": "true", "tls.certfile": str(files["cert"])})


def test_source_and_sink_both_carry_the_client_options() -> None:
    raw = {"namesrv": "h:1", "topic": "T", "accessKey": "ak", "secretKey": SECRET, "tls": "true"}
    for opts in (SinkOptions.parse(raw), SourceOptions.parse(raw, streaming=False)):
        assert opts.client.access_key == "ak"
        assert opts.client.transport_options == {"tls": True}


def test_kafka_producer_settings_are_ignored_with_an_info_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tidemq_spark.sink_options"):
        opts = SinkOptions.parse(
            {"namesrv": "h:1", "kafka.acks": "all", "kafka.ssl.truststore.location": "/x"}
        )
    assert opts.namesrv == "h:1"
    lines = [r.getMessage() for r in caplog.records]
    assert any("kafka.acks is a Kafka producer setting and is ignored" in line for line in lines)
    assert any("kafka.ssl.truststore.location" in line and "tls.*" in line for line in lines)


def test_the_source_does_not_warn_about_client_options(caplog: pytest.LogCaptureFixture) -> None:
    from tidemq_spark.source_options import warn_unknown

    raw = {"access.key": "ak", "SecretKey": SECRET, "tls": "true", "tls.cafile": "/x", "tls_keyfile": "/y"}
    assert warn_unknown(raw) == []
