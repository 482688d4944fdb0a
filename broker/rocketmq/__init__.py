"""RocketMQ 5 clients against gms: the gRPC messaging API (issue 17), served by the broker with
``--rocketmq-listen``. Needs the ``rocketmq`` extra (``pip install '.[rocketmq]'`` in the checkout):
its generated stubs (``rocketmq.grpc_protocol``) are the protocol; import this package's modules
only where the endpoint is asked for."""

import importlib.util

# What the messages about a missing extra tell to install. From the checkout: the distribution is
# gms-mq, and PyPI's `gms` is an unrelated project that `pip install 'gms[rocketmq]'` would fetch.
ROCKETMQ_EXTRA = "the rocketmq extra: pip install '.[rocketmq]' in the gms checkout"


def stubs_installed() -> bool:
    """Whether the ``rocketmq`` extra (the official client and its stubs) is installed."""
    return importlib.util.find_spec("rocketmq") is not None
