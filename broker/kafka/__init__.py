"""Kafka clients against gms: Kafka's wire protocol, served by the broker with ``--kafka-listen``
(issue 32; docs/kafka-compat.md). An adapter on the broker's services (docs/architecture.md):

- :mod:`.wire`, :mod:`.schema`, :mod:`.apis`: the protocol's primitive types, Apache Kafka's own
  message schemas interpreted for any version, the APIs and versions served, the headers;
- :mod:`.records`, :mod:`.convert`: record batches v2 (CRC-32C, compression) and their records as
  gms records;
- :mod:`.cluster`, :mod:`.data`, :mod:`.offsets`: the answers, through the services only;
- :mod:`.groups`: Kafka's classic consumer group protocol on the group's coordinator;
- :mod:`.group_admin`, :mod:`.configs`: the admin APIs (groups listed, described and deleted;
  topic configs as gms settings; partitions added);
- :mod:`.idempotence`: InitProducerId, and idempotent producers' batches stamped with gms's
  producer sequences;
- :mod:`.sasl`, :mod:`.access`: with security on, who a connection is (SASL, a client
  certificate) and gms's ACLs on each request;
- :mod:`.server`: the TCP endpoint on the broker's event loop.
"""
