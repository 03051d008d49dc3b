"""The NameServer: brokers register their topics here; clients look routes up."""

from tidemq.namesrv.kvconfig import KVConfigManager
from tidemq.namesrv.processor import NamesrvProcessor
from tidemq.namesrv.routeinfo import BrokerLiveInfo, RegisterBrokerResult, RouteInfoManager
from tidemq.namesrv.server import NameServer

__all__ = [
    "BrokerLiveInfo",
    "KVConfigManager",
    "NameServer",
    "NamesrvProcessor",
    "RegisterBrokerResult",
    "RouteInfoManager",
]
