"""The plain ACL checked in the request lanes (issue 38): the read lane takes signed sends, and
every answer and stored byte is what the Python way (``validate`` before the handler) gives.

Three brokers in one process share one ``plain_acl.yml``: ``lane`` (the read lane with the
access validator's lane check), ``decoded`` (``[transport.tcp] read_lane = false``: decoded
commands, the lane check before ``validate``) and ``python`` (no store lane, no lane check:
``validate`` and the Python handler, the reference).  They get the same requests, signed by
tidemq's signer as RocketMQ's clients sign (the official client's recorded sends re-signed as
rocketmq-client-cpp signs, with ``OnsChannel``), refused ones among them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_send_lane import RECORDED, TOPIC, Pair, _numbered_keep_type, v2

from tidemq.acl import AccessDenied, lane_access_check, sign_request
from tidemq.broker import lanes
from tidemq.message import BatchItem, encode_batch, properties_to_string
from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codes import RequestCode, ResponseCode, SerializeType
from tidemq.remoting.command import stringify_fields
from tidemq.testing.pytest_plugin import running_broker
from tidemq_acl.resources import HEADER_ONLY_FIELDS, needed_resources
from tidemq_acl.validator import PlainAccessValidator

frame_module = pytest.importorskip("tidemq._native._frame_lane")

pytestmark = pytest.mark.timeout(300)

ACL = f"""\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: producer-ak
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {TOPIC}=PUB|SUB
      - Denied=DENY
  - accessKey: reader-ak
    secretKey: reader-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - {TOPIC}=SUB
  - accessKey: white-ak
    secretKey: white-secret
    whiteRemoteAddress: 127.0.0.1
    defaultTopicPerm: PUB
  - accessKey: remote-ak
    secretKey: remote-secret
    whiteRemoteAddress: 10.1.1.*
    defaultTopicPerm: PUB
  - accessKey: admin-ak
    secretKey: admin-secret
    admin: true
  - accessKey: compat-ak
    secretKey: compat-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - AclCompat=PUB|SUB
    groupPerms:
      - ACL_COMPAT_PG=PUB
"""
#: SEND_MESSAGE frames rocketmq==0.4.4 wrote with session credentials (compat-ak / compat-secret,
#: OnsChannel ALIYUN) to topic AclCompat, recorded through a TCP proxy: unlike its unsigned sends
#: (``RECORDED``), its JSON headers carry numbers among the ext fields (``"queueId":0``), keys in
#: order, and end in a newline.
SIGNED_RECORDED = Path(__file__).parent / "data" / "official_client_signed_sends.bin"
PRODUCER = ("producer-ak", "producer-secret")
_KEYS = itertools.count(1)


class AclTrio(Pair):
    """:class:`test_send_lane.Pair`'s brokers with the plain ACL of one shared file."""

    def __init__(self, root: Path) -> None:
        self.acl_file = root / "plain_acl.yml"
        self.acl_file.write_text(ACL)
        super().__init__(root, ("lane", True), ("decoded", True, False), ("python", False))
        python = self.brokers["python"]
        assert python.send_lane is None
        python.acl_lane = None  # validate for every request: the reference
        for name in ("lane", "decoded"):
            assert self.brokers[name].acl_lane is not None

    async def _start(self, name: str, on: bool, reads: bool = True) -> Any:
        cm = running_broker(
            self.root / name,
            {"store": "mmap", "flush": self.flush, "acl": "plain"},
            options={
                "store": {"mmap": {"request_lanes": on, "commitlog_file_size": 64 * 1024}},
                "transport": {"tcp": {"read_lane": reads}},
                "acl": {"plain": {"file": str(self.acl_file), "reload_check_s": 0.05}},
            },
        )
        broker = await cm.__aenter__()
        self._stops.append(cm)
        return broker

    def rewrite_acl(self, text: str) -> None:
        import os
        import time

        self.acl_file.write_text(text)
        st = self.acl_file.stat()
        os.utime(self.acl_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        time.sleep(0.1)  # past reload_check_s


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclTrio]:
    pair = AclTrio(tmp_path_factory.mktemp("acllane"))
    try:
        for topic in (TOPIC, "Denied", "Other", "AclCompat"):
            create = signed(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                stringify_fields({"topic": topic, "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}),
                None,
                ("admin-ak", "admin-secret"),
            )
            got = pair.raw_exchange(_numbered_keep_type([create]), True)
            for frames in got.values():
                assert FrameDecoder().feed(frames[0])[0].code == ResponseCode.SUCCESS
        yield pair
    finally:
        pair.close()


def signed(
    code: int,
    fields: dict[str, str],
    body: bytes | None,
    account: tuple[str, str] | None = PRODUCER,
    *,
    channel: str | None = None,
    secret: str | None = None,
) -> RemotingCommand:
    """A request signed by ``account`` (``secret``: signed with another secret; None: unsigned)."""
    request = RemotingCommand(code, opaque=0, ext_fields=dict(fields), body=body)
    if account is not None:
        sign_request(request, account[0], secret or account[1], channel=channel)
    return request


def single(topic: str = TOPIC, queue: int = 1, size: int = 16, **sign: Any) -> RemotingCommand:
    fields = v2(b=topic, e=str(queue), i=properties_to_string({"UNIQ_KEY": f"ACL{next(_KEYS):029X}"}))
    return signed(RequestCode.SEND_MESSAGE_V2, fields, b"s" * size, **sign)


def batch(topic: str = TOPIC, queue: int = 2, count: int = 3, **sign: Any) -> RemotingCommand:
    body = encode_batch(
        [BatchItem(b"b" * (i + 1), 0, {"UNIQ_KEY": f"ACLB{next(_KEYS):028X}"}) for i in range(count)]
    )
    return signed(RequestCode.SEND_BATCH_MESSAGE, v2(b=topic, e=str(queue), m="true", i=None), body, **sign)


def codes(frames: list[bytes]) -> list[int]:
    return [FrameDecoder().feed(f)[0].code for f in frames]


def assert_alike(trio: AclTrio, reqs: list[RemotingCommand], pipelined: bool) -> list[bytes]:
    got = trio.raw_exchange(_numbered_keep_type(reqs), pipelined)
    assert got["lane"] == got["decoded"] == got["python"], [FrameDecoder().feed(f) for f in got["lane"]]
    assert trio.commit_log("lane") == trio.commit_log("decoded") == trio.commit_log("python")
    return got["lane"]


# --------------------------------------------------------------------------- the brokers
def test_signed_sends_take_the_read_lane_with_acl_on(trio: AclTrio) -> None:
    """Before: with access control every read went the Python way (frames taken: 0)."""
    taken, answered = frame_module.frame_counts()
    admitted = lanes.acl_counters["admitted"]
    runs = lanes.lane_counts()["send_runs_served"]
    reqs = [single(queue=i % 4, size=i) for i in range(10)] + [batch(queue=i) for i in range(4)]
    for pipelined in (True, False):
        got = assert_alike(trio, reqs, pipelined)
        assert codes(got) == [ResponseCode.SUCCESS] * len(reqs)
        reqs = [single(queue=i % 4, size=i) for i in range(10)] + [batch(queue=i) for i in range(4)]
    after_taken, after_answered = frame_module.frame_counts()
    assert after_taken - taken == 2 * 14  # the lane broker's frames, all taken from the bytes
    assert after_answered - answered >= 1 + 14  # answered by the compiled encoder
    # the lane broker's frames in the lane, the decoded broker's requests before validate
    assert lanes.acl_counters["admitted"] - admitted == 2 * 2 * 14
    table = lanes.lane_counts()
    assert table["acl_admitted"] == lanes.acl_counters["admitted"]
    # prepared by the compiled step (a V2 header with AccessKey and Signature is taken)
    assert table["send_runs_served"] - runs >= 2 * (1 + 14)


def refusals() -> list[RemotingCommand]:
    """Allowed and refused sends, mixed (each a new message)."""
    white = single(account=("white-ak", "white-secret"))  # from its white address: no signature needed
    white.ext_fields.pop("Signature")
    return [
        single(),
        single(secret="not-the-secret"),  # wrong signature
        single(),
        single(account=("stranger-ak", "stranger-secret")),  # unknown account
        batch(),
        single(topic="Denied"),  # DENY on the topic
        single(topic="Other"),  # the default topic permission: DENY
        batch(account=("reader-ak", "reader-secret")),  # SUB only
        single(account=None),  # unsigned
        single(account=("remote-ak", "remote-secret"), secret="x" * 8),  # not from its white address
        white,
        single(),
    ]


def test_refusals_are_answered_as_before_and_stop_nothing_else(trio: AclTrio) -> None:
    before = {b.acl_refusals for b in trio.brokers.values()}
    ok, no = ResponseCode.SUCCESS, ResponseCode.NO_PERMISSION
    for pipelined in (True, False):
        answers = [FrameDecoder().feed(f)[0] for f in assert_alike(trio, refusals(), pipelined)]
        assert [a.code for a in answers] == [ok, no, ok, no, ok, no, no, no, no, no, ok, ok]
        assert "signature check failed for accessKey producer-ak" in (answers[1].remark or "")
        assert "no ACL account for accessKey stranger-ak" in (answers[3].remark or "")
        assert "topic:Denied" in (answers[5].remark or "")
    after = {b.acl_refusals for b in trio.brokers.values()}
    assert len(before) == len(after) == 1 and after.pop() - before.pop() == 2 * 7  # each once, by validate


def test_official_client_sends_signed_as_the_cpp_client_signs(trio: AclTrio) -> None:
    """The recorded SEND_MESSAGE frames of rocketmq==0.4.4 (long names), with the fields its
    ClientRPCHook adds: AccessKey, OnsChannel and the Signature over them."""
    recorded = [r for r in FrameDecoder().feed(RECORDED.read_bytes()) if not r.flag & 2]
    reqs = []
    for r in recorded:
        fields = dict(r.ext_fields)
        reqs.append(signed(r.code, fields, r.body, channel="ALIYUN"))
    taken, _ = frame_module.frame_counts()
    for pipelined in (True, False):
        got = assert_alike(trio, reqs, pipelined)
        assert set(codes(got)) == {ResponseCode.SUCCESS}
    assert frame_module.frame_counts()[0] - taken == 2 * len(recorded)


def _frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        end = 4 + int.from_bytes(data[:4], "big")
        out.append(data[:end])
        data = data[end:]
    return out


def test_the_official_clients_own_signed_frames_take_the_read_lane(trio: AclTrio) -> None:
    """The signed frames as rocketmq-client-cpp wrote them, not re-encoded: numbers among the ext
    fields went the decoder's way before (frames taken: 0); now the read lane takes them, and the
    answers and the commit log are the decoded path's and the Python way's."""
    frames = _frames(SIGNED_RECORDED.read_bytes())
    assert b'"queueId":0' in frames[0] and b'"version":63}\nsigned-0' in frames[0]
    taken, _ = frame_module.frame_counts()
    got = trio.raw_exchange(frames, True)
    assert got["lane"] == got["decoded"] == got["python"]
    assert trio.commit_log("lane") == trio.commit_log("decoded") == trio.commit_log("python")
    assert set(codes(got["lane"])) == {ResponseCode.SUCCESS}
    assert frame_module.frame_counts()[0] - taken == len(frames)
    again = trio.raw_exchange(frames, False)  # resends: answered from the duplicate window alike
    assert again["lane"] == again["decoded"] == again["python"]


def test_a_binary_header_and_a_security_token_are_checked_alike(trio: AclTrio) -> None:
    reqs = []
    for token in (None, "sts-token"):
        r = single(account=None)
        sign_request(r, *PRODUCER, token=token)
        r.serialize_type = SerializeType.ROCKETMQ
        reqs.append(r)
    got = assert_alike(trio, reqs, True)
    assert codes(got) == [ResponseCode.SUCCESS] * 2


def test_a_global_white_address_and_a_reload_are_seen_by_the_lane_check(trio: AclTrio) -> None:
    try:
        trio.rewrite_acl(
            ACL.replace("globalWhiteRemoteAddresses:", "globalWhiteRemoteAddresses:\n  - 127.0.0.*")
        )
        got = assert_alike(trio, [single(account=None), single(topic="Other", account=None)], True)
        assert codes(got) == [ResponseCode.SUCCESS] * 2
        trio.rewrite_acl(ACL.replace(f"{TOPIC}=PUB|SUB", f"{TOPIC}=SUB"))
        got = assert_alike(trio, [single(), single()], True)  # the decisions kept were of the old rules
        assert codes(got) == [ResponseCode.NO_PERMISSION] * 2
    finally:
        trio.rewrite_acl(ACL)
    assert codes(assert_alike(trio, [single()], True)) == [ResponseCode.SUCCESS]


def test_pulls_checked_by_the_lane_check_answer_as_validate(trio: AclTrio) -> None:
    """The same pulls on the lane broker with its lane check and without (validate alone): the
    same bytes; a reader without SUB on the group or topic is refused alike."""
    broker = trio.brokers["lane"]
    assert codes(assert_alike(trio, [single(queue=3) for _ in range(3)], True)) == [0] * 3

    def pull(account: tuple[str, str], topic: str = TOPIC) -> RemotingCommand:
        fields = {
            "consumerGroup": "cg",
            "topic": topic,
            "queueId": "3",
            "queueOffset": "0",
            "maxMsgNums": "32",
            "sysFlag": "4",
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subscription": "*",
            "subVersion": "0",
            "expressionType": "TAG",
        }
        return signed(RequestCode.PULL_MESSAGE, fields, None, account)

    reader = ("reader-ak", "reader-secret")
    reqs = [pull(reader), pull(PRODUCER), pull(reader, topic="Denied")]
    reqs.append(signed(RequestCode.PULL_MESSAGE, dict(reqs[0].ext_fields), None, reader, secret="x" * 8))
    admitted = lanes.acl_counters["admitted"]
    served = lanes.lane_counts()["pull_served"]
    with_check = _pulls(trio, broker, reqs)
    assert lanes.acl_counters["admitted"] - admitted == 2  # the two allowed pulls
    assert lanes.lane_counts()["pull_served"] - served == 2
    check, broker.acl_lane = broker.acl_lane, None
    try:
        without = _pulls(trio, broker, reqs)
    finally:
        broker.acl_lane = check
    assert with_check == without
    assert (
        codes(with_check) == [ResponseCode.SUCCESS, ResponseCode.SUCCESS] + [ResponseCode.NO_PERMISSION] * 2
    )


def _pulls(trio: AclTrio, broker: Any, reqs: list[RemotingCommand]) -> list[bytes]:
    from test_send_lane import _exchange

    return trio.run(_exchange(broker.address, _numbered_keep_type(reqs), False, raw=True))


# --------------------------------------------------------------------------- the check alone
_ACCOUNTS = [PRODUCER, ("reader-ak", "reader-secret"), ("white-ak", "white-secret"), ("remote-ak", "r" * 9)]


@st.composite
def lane_requests(draw: st.DrawFn) -> tuple[RemotingCommand, str]:
    code = draw(
        st.sampled_from(
            [
                RequestCode.SEND_MESSAGE_V2,
                RequestCode.SEND_BATCH_MESSAGE,
                RequestCode.SEND_MESSAGE,
                RequestCode.PULL_MESSAGE,
                RequestCode.HEART_BEAT,
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                RequestCode.QUERY_CONSUMER_OFFSET,
            ]
        )
    )
    topic = draw(st.sampled_from([TOPIC, "Denied", "Other", "%RETRY%cg", "%RETRY%Denied"]))
    group = draw(st.sampled_from(["cg", "PG", "Denied"]))
    if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        fields = v2(b=topic, a=group)
    elif code == RequestCode.SEND_MESSAGE:
        fields = {"topic": topic, "producerGroup": group, "queueId": "1"}
    else:
        fields = {"topic": topic, "consumerGroup": group}
    if draw(st.booleans()):
        fields[draw(st.sampled_from(["x", "Ünï", "_UNIQUE_KEY_QUERY", "OnsChannel"]))] = draw(
            st.text(max_size=4)
        )
    body = draw(st.one_of(st.none(), st.binary(max_size=20)))
    request = RemotingCommand(code, opaque=0, ext_fields=fields, body=body)
    kind = draw(st.sampled_from(["good", "good", "wrong", "unsigned", "stranger", "empty", "token"]))
    account = draw(st.sampled_from(_ACCOUNTS))
    if kind in ("good", "token"):
        sign_request(request, *account, token="t" if kind == "token" else None)
    elif kind == "wrong":
        sign_request(request, account[0], "wrong-secret")
    elif kind == "stranger":
        sign_request(request, "stranger-ak", "stranger-secret")
    elif kind == "empty":
        sign_request(request, *account)
        request.ext_fields["Signature"] = ""
    host = draw(st.sampled_from(["127.0.0.1:5000", "10.1.1.7:5000", "[::1]:5000", "192.0.2.1:1"]))
    return request, host


@pytest.fixture(scope="module")
def validator(tmp_path_factory: pytest.TempPathFactory) -> PlainAccessValidator:
    path = tmp_path_factory.mktemp("aclcheck") / "plain_acl.yml"
    path.write_text(ACL)
    return PlainAccessValidator(path, reload_check_s=0)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(lane_requests())
def test_the_lane_check_admits_exactly_what_validate_allows(
    validator: PlainAccessValidator, case: tuple[RemotingCommand, str]
) -> None:
    request, host = case
    check = lane_access_check(validator)
    assert check is not None
    admitted = check.admits(request.code, request.ext_fields, request.payload() or None, host)
    try:
        validator.validate(request, host)
        allowed = True
    except AccessDenied:
        allowed = False
    if request.code in HEADER_ONLY_FIELDS:
        assert admitted == allowed
    else:
        assert not admitted  # any other code: validate decides
    # asked again (its decisions kept): the same
    assert check.admits(request.code, request.ext_fields, request.payload() or None, host) == admitted


def _acl_checks_on_metrics() -> dict[str, float]:
    from tidemq_metrics_prometheus.lane_metrics import lane_families

    (family,) = [f for f in lane_families() if f.name == "tidemq_lane_acl_checks"]
    return {s.labels["outcome"]: s.value for s in family.samples}


def test_the_lane_checks_are_counted_on_metrics(validator: PlainAccessValidator) -> None:
    """``tidemq_lane_acl_checks_total{outcome}`` on /metrics: what the lane check admitted and
    what it left to ``validate`` (before, only the runtime info had them)."""
    access = lanes.lane_access(validator)
    if access is None:
        pytest.skip("no lane check (TIDEMQ_NO_EXTENSIONS=1)")
    before = _acl_checks_on_metrics()
    ok, wrong = single(), single(secret="not-the-secret")
    assert access.admits(ok.code, ok.ext_fields, ok.payload() or None, "127.0.0.1")
    assert not access.admits(wrong.code, wrong.ext_fields, wrong.payload() or None, "127.0.0.1")
    after = _acl_checks_on_metrics()
    assert after["admitted"] - before["admitted"] == 1
    assert after["to_python"] - before["to_python"] == 1
    assert after == {
        "admitted": lanes.lane_counts()["acl_admitted"],
        "to_python": lanes.lane_counts()["acl_to_python"],
    }


class _Recording(dict[str, Any]):
    def __init__(self, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


@pytest.mark.parametrize("code", sorted(HEADER_ONLY_FIELDS))
def test_header_only_codes_need_no_other_field_nor_the_body(code: int) -> None:
    """What the lane check keys its kept decisions by is all ``needed_resources`` reads."""
    every = {name: "%RETRY%g" for names in HEADER_ONLY_FIELDS.values() for name in names}
    fields = _Recording({**every, "queueId": "1", "originTopic": "t", "group": "g", "offset": "1"})

    class Request:
        ext_fields = fields

        def __init__(self) -> None:
            self.code = code

        def payload(self) -> bytes:
            raise AssertionError("the body was read")

    needed_resources(Request())
    assert fields.read <= set(HEADER_ONLY_FIELDS[code])


def test_a_validator_without_a_lane_check_keeps_the_python_way() -> None:
    from tidemq.acl import AllowAll

    assert lane_access_check(AllowAll()) is None
    assert lanes.lane_access(None) is None


def test_no_extensions_means_no_lane_check(
    validator: PlainAccessValidator, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert lanes.lane_access(validator) is not None
    monkeypatch.setenv("TIDEMQ_NO_EXTENSIONS", "1")
    assert lanes.lane_access(validator) is None


def test_a_failing_lane_check_fails_closed() -> None:
    class Broken:
        description = "broken"

        def admits(self, *args: Any) -> bool:
            raise RuntimeError("bug")

    access = lanes.LaneAccess(Broken())
    assert access.admits(RequestCode.SEND_MESSAGE_V2, {}, None, "127.0.0.1:1") is False
    frames: list[Any] = [(RequestCode.SEND_MESSAGE_V2, 0, 0, 1, 0, None, {}, b"", 0)]
    assert access.admits_all(frames, "127.0.0.1:1") is False
