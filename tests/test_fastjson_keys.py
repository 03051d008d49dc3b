"""fastjson's bare integer keys are quoted by one function, and never inside a string value.

A Java NameServer writes ``"brokerAddrs":{0:"10.0.0.1:10911"}``: the body is not JSON until the
keys are quoted.  A string value that looks like a key (``",12:"``, ``"{3:"``) must come back as
it was sent, whichever decoder reads the body: the NameServer protocol models, the client's routes
and the files RocketMQ wrote.
"""

from __future__ import annotations

import time

import pytest

from tidemq.client.route import TopicRoute, loads_lenient
from tidemq.jsonfile import quote_bare_int_keys, read_json
from tidemq.remoting.errors import BodyError
from tidemq.remoting.protocol import KVTable, TopicRouteData, loads

CLUSTER = "edge,12:west"  # a value holding what the old regexes took for a key
ORDER_CONF = "{3:broker-a:4"

ROUTE_BODY = (
    b'{"orderTopicConf":"{3:broker-a:4","queueDatas":[{"brokerName":"broker-a","perm":6,'
    b'"readQueueNums":4,"writeQueueNums":4,"topicSynFlag":0}],"brokerDatas":[{"brokerAddrs":'
    b'{0:"10.0.0.1:10911",1:"10.0.0.2:10911"},"brokerName":"broker-a","cluster":"edge,12:west"}],'
    b'"filterServerTable":{}}'
)


def test_quote_bare_int_keys_leaves_strings_alone():
    body = b'{0:"a,1:b",-2 :{"x{3:":"\\",4:"}}'
    assert quote_bare_int_keys(body) == b'{"0":"a,1:b","-2" :{"x{3:":"\\",4:"}}'


def test_route_data_decodes_a_fastjson_body_and_keeps_its_strings():
    route = TopicRouteData.decode(ROUTE_BODY)
    assert route.order_topic_conf == ORDER_CONF
    assert route.broker_datas[0].cluster == CLUSTER
    assert route.broker_datas[0].broker_addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}


def test_kv_table_value_like_a_key_survives():
    body = b'{"table":{"T":"{1:x,2:y"},"ids":{7:"z"}}'
    assert KVTable.decode(body).table == {"T": "{1:x,2:y"}
    assert loads(body)["ids"] == {"7": "z"}


def test_client_route_decodes_a_fastjson_body_and_keeps_its_strings():
    route = TopicRoute.from_json("T", ROUTE_BODY)
    assert route.broker_datas[0].cluster == CLUSTER
    assert route.broker_datas[0].broker_addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    assert loads_lenient(ROUTE_BODY)["orderTopicConf"] == ORDER_CONF
    assert loads_lenient(ROUTE_BODY.decode())["orderTopicConf"] == ORDER_CONF


def test_rocketmq_file_with_a_key_like_value(tmp_path):
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(b'{"offsetTable":{"T@g,1:x":{0:250,1:251}}}')
    assert read_json(path) == {"offsetTable": {"T@g,1:x": {"0": 250, "1": 251}}}


def test_an_unterminated_string_costs_linear_time():
    # Searching again from every later quote made this quadratic: minutes for a body this size.
    body = b'{0:"' + b'\\"' * 200_000
    started = time.perf_counter()
    assert quote_bare_int_keys(body) == b'{"0":"' + b'\\"' * 200_000
    with pytest.raises(BodyError):
        loads(body)
    assert time.perf_counter() - started < 5.0
