"""tidemq_ha_replication: the ``none`` and ``master_slave`` replications (RocketMQ's HA).

Other plugins import only from :mod:`tidemq_ha_replication.api`, whose ``__all__`` is this
plugin's public API (the building blocks of another replication over the same HA stream); every
other module here is internal.
"""
