"""The router's own Prometheus page (native_engine/router.py): which replica got each request and why."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RouterMetrics:
    """Under `native_router:`, apart from the replicas' `native:` names; GET /replicas lists the replicas
    so that a scraper can read each one's own page too (harness/engine/server_metrics.py does)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("native_router:requests", "Requests sent to each replica", ["replica"], registry=r)
        self.failures = Counter(
            "native_router:request_failures",
            "Requests a replica failed, by where it failed",
            ["replica", "reason"],
            registry=r,
        )
        self.decisions = Counter(
            "native_router:routing_decisions",
            "Routing decisions by policy and reason",
            ["policy", "reason"],
            registry=r,
        )
        self.prefix_match = Histogram(
            "native_router:prefix_match_chars",
            "cache_aware: prompt characters the chosen replica was sent before",
            registry=r,
            buckets=(0, 16, 64, 256, 1024, 4096, 16384, 65536),
        )
        self.up = Gauge("native_router:replica_up", "1 while the replica answers, else 0", ["replica"], registry=r)
        self.in_flight = Gauge(
            "native_router:replica_requests_in_flight", "Requests in flight per replica", ["replica"], registry=r
        )
