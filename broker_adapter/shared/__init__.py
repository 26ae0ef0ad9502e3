"""A ``rocksdb://`` directory shared by many processes: the first opener owns it and
serves it on a Unix socket; later openers become its clients and take over when it
leaves. See :mod:`broker_adapter.shared.broker`; submodules load on use.
"""
