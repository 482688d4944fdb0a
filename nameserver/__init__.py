"""The nameserver: etcd-backed routing and cluster metadata."""
