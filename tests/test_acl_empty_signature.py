"""An empty ``Signature`` proves nothing: the ACL refuses it like a wrong one (found by mutation
testing, tests/mutation/REPORT.md: ``verify_signature`` answering True for an empty signature let
every request with a known access key through)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_acl_broker import ADMIN, AclCluster, _send_fields, raw

from tidemq.acl import verify_signature
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(120)


def test_an_empty_or_missing_signature_does_not_verify() -> None:
    for fields in ({"AccessKey": "producer-ak", "Signature": ""}, {"AccessKey": "producer-ak"}):
        req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "Orders", **fields}, b"x")
        assert not verify_signature(req, "producer-secret")


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclCluster]:
    c = AclCluster(tmp_path_factory.mktemp("acl"))
    out = c.admin("updateTopic", "-t", "Orders", "-r", "2", "-w", "2", "-b", c.broker, *ADMIN)
    assert out.returncode == 0, out.stderr
    yield c
    c.stop()


def test_a_send_with_an_empty_signature_is_refused(acl_broker: AclCluster) -> None:
    fields = {**_send_fields("Orders"), "AccessKey": "producer-ak", "Signature": ""}
    refused = raw(acl_broker.broker, RequestCode.SEND_MESSAGE_V2, fields, b"forged")
    assert refused.code == ResponseCode.NO_PERMISSION, refused.remark
    # The same send, signed, is accepted: the refusal was the signature's.
    signed = raw(
        acl_broker.broker,
        RequestCode.SEND_MESSAGE_V2,
        _send_fields("Orders"),
        b"signed",
        ak="producer-ak",
        sk="producer-secret",
    )
    assert signed.code == ResponseCode.SUCCESS, signed.remark
