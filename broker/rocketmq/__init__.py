"""RocketMQ 5 clients against gms: the gRPC messaging API (issue 17), served by the broker with
``--rocketmq-listen``. Needs the ``rocketmq`` extra (``pip install 'gms[rocketmq]'``): its
generated stubs (``rocketmq.grpc_protocol``) are the protocol; import this package's modules only
where the endpoint is asked for."""
