"""Cluster plumbing shared by the nameserver and the broker: the etcd client adapter, the key
model and metadata values, the watch-fed cluster view and lease keeping."""
