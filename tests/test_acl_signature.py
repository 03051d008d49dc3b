"""RocketMQ's ACL signature, address patterns, plain_acl.yml parsing and the plain validator's
decisions, on real RemotingCommand objects (the broker-level tests are in test_acl_broker.py)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from tidemq.acl import AccessDenied, calc_signature, sign_request, signature_content, verify_signature
from tidemq.client.credentials import SessionCredentials
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand
from tidemq.testing.store_contract import build_store, message, put
from tidemq_acl.accounts import AclConfigError, load_plain_acl
from tidemq_acl.address import AddressPatternError, compile_pattern, host_of
from tidemq_acl.validator import PlainAccessValidator

# --------------------------------------------------------------------------- signature vectors


def test_signature_matches_a_vector_computed_by_hand_from_rocketmqs_definition() -> None:
    # Sorted keys (Java String order: upper case first): AccessKey, OnsChannel, a, b; the values
    # are concatenated, then the body: "RocketMQ" "ALIYUN" "pg" "TopicA" "hello".
    # HmacSHA1 with key "12345678", base64: computed once with
    #   printf 'RocketMQALIYUNpgTopicAhello' | openssl dgst -sha1 -hmac 12345678 -binary | base64
    req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "TopicA", "a": "pg"}, b"hello")
    sign_request(req, "RocketMQ", "12345678", channel="ALIYUN")
    assert req.ext_fields["Signature"] == "mkEwIPjUW1B1pQLEY7tngDDkSCY="
    assert req.ext_fields["AccessKey"] == "RocketMQ"
    assert signature_content(req.ext_fields, req.body) == b"RocketMQALIYUNpgTopicAhello"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_signature_agrees_with_openssl_on_utf8_fields_and_binary_body() -> None:
    body = bytes(range(256)) * 3
    fields = {"topic": "Topic-\u00e9\u4e2d", "queueId": "3", "AccessKey": "ak-1234567", "Z": "last?"}
    content = signature_content(fields, body)
    out = subprocess.run(
        ["openssl", "dgst", "-sha1", "-hmac", "s\u00e9cret-key", "-binary"],
        input=content,
        capture_output=True,
        check=True,
    )
    assert calc_signature(content, "s\u00e9cret-key") == base64.b64encode(out.stdout).decode()
    # Upper-case keys sort before lower-case ones, as in Java's TreeMap.
    assert content.startswith(b"ak-1234567last?3")


def test_signature_leaves_out_signature_and_unique_key_query_fields() -> None:
    base = signature_content({"a": "1", "b": "2"}, None)
    assert (
        signature_content({"a": "1", "b": "2", "Signature": "x", "_UNIQUE_KEY_QUERY": "true"}, None) == base
    )


def test_verify_refuses_a_changed_field_body_or_secret() -> None:
    req = RemotingCommand.request(RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "G"})
    SessionCredentials("ak-1234567", "sk-1234567").sign(req)
    assert verify_signature(req, "sk-1234567")
    assert not verify_signature(req, "sk-7654321")
    req.ext_fields["topic"] = "Other"
    assert not verify_signature(req, "sk-1234567")
    req2 = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "T"}, b"body")
    SessionCredentials("ak-1234567", "sk-1234567").sign(req2)
    req2.body = b"Body"
    assert not verify_signature(req2, "sk-1234567")


def test_resigning_a_request_replaces_its_signature() -> None:
    creds = SessionCredentials("ak-1234567", "sk-1234567", channel="ALIYUN")
    req = RemotingCommand.request(RequestCode.HEART_BEAT, {}, b"{}")
    creds.sign(req)
    req.ext_fields["extra"] = "1"
    creds.sign(req)  # a retried request is signed again over its current fields
    assert verify_signature(req, "sk-1234567")


def test_credentials_never_show_the_secret() -> None:
    creds = SessionCredentials("ak-1234567", "very-secret-value")
    assert "very-secret-value" not in repr(creds)


# --------------------------------------------------------------------------- address patterns


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("*", ["10.1.2.3", "::1"], []),
        ("*.*.*.*", ["192.168.0.1"], []),
        ("192.168.0.1", ["192.168.0.1", "::ffff:192.168.0.1"], ["192.168.0.2"]),
        ("192.168.0.*", ["192.168.0.0", "192.168.0.255"], ["192.168.1.1", "10.0.0.1"]),
        ("192.168.*.*", ["192.168.7.9"], ["192.169.0.1"]),
        ("192.168.1.1-100", ["192.168.1.1", "192.168.1.100"], ["192.168.1.101", "192.168.1.0"]),
        ("192.168.1-3.*", ["192.168.2.200"], ["192.168.4.1"]),
        ("192.168.1.{1,2,3}", ["192.168.1.2"], ["192.168.1.4"]),
        ("10.0.0.1,10.0.0.5", ["10.0.0.5"], ["10.0.0.2"]),
        ("::1", ["::1", "0:0:0:0:0:0:0:1"], ["127.0.0.1"]),
        ("", [], ["127.0.0.1"]),
    ],
)
def test_white_address_patterns_match_as_rocketmq(pattern: str, yes: list[str], no: list[str]) -> None:
    match = compile_pattern(pattern)
    assert all(match(h) for h in yes)
    assert not any(match(h) for h in no)


@pytest.mark.parametrize(
    "pattern", ["192.168.1.300", "192.168.1.9-2", "*.168.1.1", "192.168.*.1", "host.name"]
)
def test_bad_white_address_patterns_are_one_line_errors(pattern: str) -> None:
    with pytest.raises(AddressPatternError) as err:
        compile_pattern(pattern)
    assert pattern in str(err.value) and "\n" not in str(err.value)


def test_host_of_cuts_the_port_like_rocketmq() -> None:
    assert host_of("127.0.0.1:10911") == "127.0.0.1"
    assert host_of("::1:10911") == "::1"


# --------------------------------------------------------------------------- plain_acl.yml

ACL_YML = """\
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 0123456789
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_rocketmq_sample_file_loads_with_secrets_kept_as_text(tmp_path: Path) -> None:
    acl = load_plain_acl(_write(tmp_path / "plain_acl.yml", ACL_YML))
    assert set(acl.accounts) == {"RocketMQ", "rocketmq2"}
    assert acl.accounts["rocketmq2"].secret_key == "0123456789"  # not the number 123456789
    assert acl.accounts["rocketmq2"].admin
    assert acl.accounts["RocketMQ"].perms["%RETRY%groupA"] == 1  # DENY, keyed by the retry topic


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("accounts: [{accessKey: short, secretKey: 12345678}]", "accessKey must be at least 7"),
        ("accounts: [{accessKey: longenough, secretKey: 123}]", "secretKey must be at least 7"),
        ("accounts: [{accessKey: longenough, secretKey: 12345678, topicPerms: [topicA]}]", "not 'name=PERM'"),
        ("accounts: [{accessKey: longenough, secretKey: 12345678, admn: true}]", "unknown key(s) admn"),
        ("globalWhiteRemoteAddresses: [300.1.1.1]", "300"),
        (
            "accounts: [{accessKey: longenough, secretKey: 12345678}, {accessKey: longenough, secretKey: 12345678}]",
            "twice",
        ),
        ("accounts: [unclosed", "not valid YAML"),
    ],
)
def test_bad_acl_files_are_one_line_errors_without_the_secret(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(AclConfigError) as err:
        load_plain_acl(_write(tmp_path / "plain_acl.yml", text))
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and "plain_acl.yml" in msg
    assert "12345678" not in msg


# --------------------------------------------------------------------------- validator decisions


def _validator(tmp_path: Path, text: str = ACL_YML, **kw: float) -> PlainAccessValidator:
    return PlainAccessValidator(_write(tmp_path / "plain_acl.yml", text), **kw)


def _req(
    code: int,
    fields: dict[str, str],
    body: bytes | None = None,
    *,
    ak: str = "RocketMQ",
    sk: str = "12345678",
) -> RemotingCommand:
    req = RemotingCommand.request(code, fields, body)
    if ak:
        sign_request(req, ak, sk)
    return req


def _send(topic: str, group: str = "pg", **kw: str) -> RemotingCommand:
    return _req(RequestCode.SEND_MESSAGE_V2, {"a": group, "b": topic, "e": "0"}, b"x", **kw)


def _denied(v: PlainAccessValidator, req: RemotingCommand, addr: str = "127.0.0.1:5000") -> str:
    with pytest.raises(AccessDenied) as err:
        v.validate(req, addr)
    return str(err.value)


def test_topic_permissions_pub_sub_deny_and_defaults(tmp_path: Path) -> None:
    v = _validator(tmp_path)
    v.validate(_send("topicB"), "127.0.0.1:5000")  # PUB|SUB
    assert "topic:topicA" in _denied(v, _send("topicA"))  # DENY
    assert "topic:topicC" in _denied(v, _send("topicC"))  # SUB only
    assert "topic:other" in _denied(v, _send("other"))  # defaultTopicPerm DENY


def test_pull_needs_sub_on_topic_and_group(tmp_path: Path) -> None:
    v = _validator(tmp_path)
    pull = {"topic": "topicC", "consumerGroup": "groupC", "queueId": "0"}
    v.validate(_req(RequestCode.PULL_MESSAGE, pull), "127.0.0.1:1")
    assert "group:groupA" in _denied(v, _req(RequestCode.PULL_MESSAGE, {**pull, "consumerGroup": "groupA"}))
    assert "topic:topicA" in _denied(v, _req(RequestCode.PULL_MESSAGE, {**pull, "topic": "topicA"}))
    # defaultGroupPerm SUB lets unknown groups consume an allowed topic.
    v.validate(_req(RequestCode.PULL_MESSAGE, {**pull, "consumerGroup": "anyGroup"}), "127.0.0.1:1")


def test_heartbeat_checks_every_group_and_subscribed_topic(tmp_path: Path) -> None:
    v = _validator(tmp_path)

    def hb(group: str, topic: str) -> RemotingCommand:
        body = {
            "clientID": "c",
            "producerDataSet": [],
            "consumerDataSet": [
                {"groupName": group, "subscriptionDataSet": [{"topic": topic, "subString": "*"}]}
            ],
        }
        return _req(RequestCode.HEART_BEAT, {}, orjson.dumps(body))

    v.validate(hb("groupC", "topicB"), "127.0.0.1:1")
    assert "group:groupA" in _denied(v, hb("groupA", "topicB"))
    assert "topic:topicA" in _denied(v, hb("groupC", "topicA"))
    assert "cannot read" in _denied(v, _req(RequestCode.HEART_BEAT, {}, b"{not json"))


def test_send_back_and_retry_topic_map_to_the_group(tmp_path: Path) -> None:
    store = build_store("memory", tmp_path / "store")
    store.start()
    try:
        offset = put(store, message("topicB")).wrote_offset
        v = PlainAccessValidator(_write(tmp_path / "plain_acl.yml", ACL_YML), store=store)
        back = {"group": "groupC", "originTopic": "topicB", "offset": str(offset), "delayLevel": "0"}
        v.validate(_req(RequestCode.CONSUMER_SEND_MSG_BACK, back), "127.0.0.1:1")
        assert "group:groupA" in _denied(
            v, _req(RequestCode.CONSUMER_SEND_MSG_BACK, {**back, "group": "groupA"})
        )
        # Without a store to read the message's topic from, sending back is an admin's request.
        assert "needs an admin account" in _denied(
            _validator(tmp_path), _req(RequestCode.CONSUMER_SEND_MSG_BACK, back)
        )
    finally:
        store.shutdown()
    # Sending to %RETRY%<group> needs SUB on the group, not PUB on the retry topic.
    v.validate(_send("%RETRY%groupC", group="groupC"), "127.0.0.1:1")
    assert "group:groupA" in _denied(v, _send("%RETRY%groupA", group="groupA"))


def test_offsets_and_consumer_lists_need_the_group(tmp_path: Path) -> None:
    v = _validator(tmp_path)
    for code in (RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.QUERY_CONSUMER_OFFSET):
        ok = {"consumerGroup": "groupC", "topic": "topicB", "queueId": "0", "commitOffset": "1"}
        v.validate(_req(code, ok), "127.0.0.1:1")
        assert "group:groupA" in _denied(v, _req(code, {**ok, "consumerGroup": "groupA"}))
    assert "group:groupA" in _denied(
        v, _req(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "groupA"})
    )
    assert "topic:topicA" in _denied(v, _req(RequestCode.QUERY_MESSAGE, {"topic": "topicA", "key": "k"}))


def test_admin_codes_need_an_admin_account(tmp_path: Path) -> None:
    v = _validator(tmp_path)
    create = {"topic": "NewTopic", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"}
    msg = _denied(v, _req(RequestCode.UPDATE_AND_CREATE_TOPIC, create))
    assert "needs an admin account" in msg and "RocketMQ" in msg
    v.validate(
        _req(RequestCode.UPDATE_AND_CREATE_TOPIC, create, ak="rocketmq2", sk="0123456789"), "127.0.0.1:1"
    )
    # An admin without resource rules may use any topic.
    v.validate(_send("topicA", ak="rocketmq2", sk="0123456789"), "127.0.0.1:1")


def test_identity_checks_unsigned_unknown_and_wrong_secret(tmp_path: Path) -> None:
    v = _validator(tmp_path)
    assert "no AccessKey" in _denied(v, _send("topicB", ak=""))
    assert "no ACL account for accessKey nobody12" in _denied(v, _send("topicB", ak="nobody12"))
    assert "signature check failed" in _denied(v, _send("topicB", sk="wrong-secret"))
    unsigned = _send("topicB", ak="")
    unsigned.ext_fields["AccessKey"] = "RocketMQ"  # names the account but carries no signature
    assert "signature check failed" in _denied(v, unsigned)


def test_white_addresses_pass_without_signature(tmp_path: Path) -> None:
    v = _validator(tmp_path)
    unsigned = _send("topicA", ak="")  # even a DENY topic: the global white list passes everything
    v.validate(unsigned, "10.10.103.7:4000")
    assert "no AccessKey" in _denied(v, unsigned, "10.10.104.7:4000")
    # The account's own white address skips the signature (the AccessKey must still be there).
    named = _send("topicB", ak="")
    named.ext_fields["AccessKey"] = "rocketmq2"
    v.validate(named, "192.168.1.20:4000")
    assert "signature" in _denied(v, named, "192.168.2.20:4000")


def test_file_changes_are_reloaded_and_a_broken_file_keeps_the_old_accounts(tmp_path: Path) -> None:
    v = _validator(tmp_path, reload_check_s=0.01)
    path = tmp_path / "plain_acl.yml"
    assert "topic:topicA" in _denied(v, _send("topicA"))
    path.write_text(ACL_YML.replace("topicA=DENY", "topicA=PUB"))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    time.sleep(0.02)
    v.validate(_send("topicA"), "127.0.0.1:1")
    path.write_text("accounts: [broken")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    time.sleep(0.02)
    assert not v.maybe_reload()
    v.validate(_send("topicA"), "127.0.0.1:1")  # the last good file is still in force


# --------------------------------------------------------------------------- configuration


def test_acl_options_and_plugin_names_are_checked_with_one_line_errors(tmp_path: Path) -> None:
    from tidemq.config import parse_config
    from tidemq.errors import ConfigError
    from tidemq.plugins import get_plugin_manager

    manager = get_plugin_manager()
    with pytest.raises(ConfigError) as err:
        parse_config({"plugins": {"acl": "plian"}}, "broker.toml", manager)
    assert "did you mean 'plain'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        manager.create("acl", "plain", options={"fil": "x.yml"}, data_dir=tmp_path)
    assert "[acl.plain]: unknown key 'fil' (did you mean 'file'?)" in str(err.value)
    with pytest.raises(AclConfigError) as err:  # the default file is looked for in the data directory
        manager.create("acl", "plain", options={}, data_dir=tmp_path)
    assert str(tmp_path / "plain_acl.yml") in str(err.value)
    _write(tmp_path / "plain_acl.yml", ACL_YML)
    validator = manager.create("acl", "plain", options={"reload_check_s": 0}, data_dir=tmp_path)
    assert "topic:topicA" in _denied(validator, _send("topicA"))
    assert manager.create("acl", "none", data_dir=tmp_path).enforcing is False


def test_pyyaml_is_loaded_with_the_first_acl_file_not_with_the_plugins(tmp_path: Path) -> None:
    """Every broker loads the ACL plugin and the NameServer's auth module; PyYAML (~1 MB of
    anonymous memory) waits for the first YAML file read (docs/operations.md, "Memory")."""
    import sys

    path = _write(tmp_path / "plain_acl.yml", ACL_YML)
    script = f"""
import sys
from tidemq.plugins import get_plugin_manager
import tidemq.broker.broker, tidemq.namesrv.server, tidemq_acl.plugin, tidemq_acl.admin
get_plugin_manager().load_entry_points()
before = "yaml" in sys.modules
from pathlib import Path
from tidemq_acl.accounts import load_plain_acl
acl = load_plain_acl(Path({str(path)!r}))
print(before, "yaml" in sys.modules, len(acl.accounts))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["False", "True", "2"], out.stdout + out.stderr
