"""What operators watch: a Prometheus ``/metrics`` endpoint with ``/healthz`` and ``/readyz``
(:mod:`gms.monitoring.http`) and the request metrics every gms server keeps
(:mod:`gms.monitoring.requests`). Each server adds its own collectors (broker.metrics,
nameserver.metrics); docs/monitoring.md lists every metric."""
