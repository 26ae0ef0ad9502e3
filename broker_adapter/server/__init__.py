"""The broker server and its client: one embedded broker, many processes.

``chronoq broker serve`` (:mod:`broker_adapter.server.cli`) runs a
:class:`~broker_adapter.server.server.BrokerServer`; processes reach it with
``open_broker("chronoq://host:port?token=...")``, a
:class:`~broker_adapter.server.client.RemoteBroker` (on the server's machine also
``chronoq+unix:///path.sock`` with ``serve --unix``, :mod:`~broker_adapter.server.unix_url`).
The wire format is in
:mod:`broker_adapter.server.protocol`. Submodules are imported on use, so
``import broker_adapter.server`` stays light.
"""
