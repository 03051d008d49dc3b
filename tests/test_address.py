"""One ``host:port`` kernel (tidemq.address.split_address) and what each caller makes of a bad value."""

from __future__ import annotations

import pytest

from tidemq.address import format_address, parse_address, split_address
from tidemq.broker.services.send import parse_host
from tidemq.errors import ConfigError
from tidemq.remoting import RemotingConnectError
from tidemq_transport_tcp import parse_address as connect_address


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:10911", ("127.0.0.1", 10911)),
        ("broker-a.example:80", ("broker-a.example", 80)),
        ("[::1]:9876", ("::1", 9876)),
        ("::1:9876", ("::1", 9876)),  # a socket's IPv6 peer name: cut at the last colon
        (":9876", ("", 9876)),
        ("9876", ("", 9876)),
    ],
)
def test_split_address(address, expected):
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["", "host", "host:", "host:x", "host:+80", "host: 80", "host:１"])
def test_split_address_refuses_a_port_that_is_not_digits(address):
    with pytest.raises(ValueError):
        split_address(address)


def test_split_address_default_port_stands_in_for_a_missing_one():
    assert split_address("host:", default_port=0) == ("host", 0)
    assert split_address("", default_port=7) == ("", 7)
    with pytest.raises(ValueError):
        split_address("host:x", default_port=0)


def test_parse_address_agrees_with_the_kernel_and_names_the_key():
    for value in ("127.0.0.1:10911", "[::1]:9876", "host_1:1"):
        assert parse_address(value, "k") == split_address(value)
    with pytest.raises(ConfigError, match="listen = '::1:9876'.*brackets"):
        parse_address("::1:9876", "listen")
    assert parse_address("0.0.0.0:0", "listen", allow_port_zero=True) == ("0.0.0.0", 0)


def test_format_address_round_trips():
    for host, port in (("127.0.0.1", 1), ("::1", 9876)):
        assert split_address(format_address(host, port)) == (host, port)


def test_born_host_falls_back_to_loopback():
    assert parse_host("10.0.0.7:50123") == ("10.0.0.7", 50123)
    assert parse_host("::1:50123") == ("::1", 50123)
    assert parse_host(":50123") == ("127.0.0.1", 50123)
    for bad in ("", "?", "host:x"):
        assert parse_host(bad) == ("127.0.0.1", 0)


def test_connect_address_refuses_with_a_connect_error():
    assert connect_address("[::1]:9876") == ("::1", 9876)
    for bad in ("host", ":9876", "host:0", "host:65536", "host:x", "[]:9876"):
        with pytest.raises(RemotingConnectError, match="expected host:port"):
            connect_address(bad)
