"""What operators watch: a Prometheus ``/metrics`` endpoint with ``/healthz`` and ``/readyz``
(:mod:`gms.monitoring.http`) and the request metrics every gms server keeps
(:mod:`gms.monitoring.requests`). Each server adds its own collectors (broker.metrics,
nameserver.metrics); docs/monitoring.md lists every metric."""

from prometheus_client import disable_created_metrics

# A ``_created`` series per counter and histogram doubles the scrape for a timestamp no
# dashboard of ours reads (Prometheus' own advice for exporters that restart with the process).
disable_created_metrics()
