"""The ports ``gms standalone`` serves on unless told otherwise (RocketMQ's where it has one):
kept apart from :mod:`gms.cli.standalone` so the CLI's options name them without importing the
supervisor."""

NAMESERVER_PORT = 9876
BROKER_PORT = 10911
NAMESERVER_METRICS_PORT = 9877  # /metrics, /healthz, /readyz
BROKER_METRICS_PORT = 10915
CONSOLE_PORT = 8082  # RocketMQ Dashboard's
ROCKETMQ_PORT = 8081  # RocketMQ 5 proxy's gRPC port: the RocketMQ API (the `rocketmq` extra)
KAFKA_PORT = 9092  # Kafka's: the Kafka API (docs/kafka-compat.md)
