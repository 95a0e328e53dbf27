"""Prefill/decode disaggregation: `serve --disaggregate prefill=P,decode=D`, the coordinator in front.

A decode worker that also prefilled would stop its running streams for every long prompt (or, with
chunked prefill, slow each of their steps). Here each request goes in two legs, to engine processes
of two roles (the same `serve`, started with a KV transfer directory):
  1. a prefill worker runs the prompt to its first token (max_tokens 1) and writes the prompt's KV
     blocks to a file in the transfer directory (kv_transfer.py); it answers with the file's name and
     the prefill's timings;
  2. a decode worker maps that file into its own KV cache, takes the first token from it, and
     streams the answer, which the coordinator passes on to the client as the router does.
The first token reaches the client from the decode worker, so TTFT includes the transfer; the answer
is then exactly the colocated engine's (text, stop strings and finish are decided in one place).
Constrained requests (a grammar's state is not handed over) and bodies that are not JSON objects go
whole to a decode worker. Each leg goes to the least busy worker of its role that is up.

The router's machinery (router.py) does the forwarding, health probes and per-worker metrics; the
workers are its replicas, named prefill-i and decode-i. The coordinator's own /metrics adds what
the handoffs cost, read from each answer's timings: native_router:kv_transfer_bytes, _blocks and
_seconds (the prefill worker's copy out plus the decode worker's copy in).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter, Histogram

from native_engine.router import Replica, ReplicaFailed, Router, error_response, read_body
from native_engine.routing_policy import Policy

GRAMMAR_FIELDS = ("response_format", "guided_json", "guided_regex")
SPEC = re.compile(r"prefill=(\d+),decode=(\d+)")
TRANSFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class DisaggregationSpec:
    prefill: int
    decode: int

    @classmethod
    def parse(cls, value: str) -> DisaggregationSpec:
        found = SPEC.fullmatch(value.replace(" ", ""))
        if not found or min(int(found.group(1)), int(found.group(2))) < 1:
            raise ValueError(
                f"--disaggregate: got {value!r}; give the worker counts as prefill=P,decode=D with "
                "P and D at least 1, e.g. --disaggregate prefill=1,decode=1"
            )
        return cls(int(found.group(1)), int(found.group(2)))

    def worker_ids(self) -> list[str]:
        return [f"prefill-{i}" for i in range(self.prefill)] + [f"decode-{i}" for i in range(self.decode)]


class Disaggregator:
    def __init__(self, spec: DisaggregationSpec, worker_urls: list[str], transfer_dir: str) -> None:
        ids = spec.worker_ids()
        self.router = Router(worker_urls, Policy("least_load", ids), replica_ids=ids)
        self.transfer_dir = transfer_dir
        self.pids: dict[str, int] = {}  # set by the deployment; listed on /replicas
        r = self.router.metrics.registry
        self.transfer_bytes = Counter(
            "native_router:kv_transfer_bytes", "KV-cache bytes handed from prefill to decode workers", registry=r
        )
        self.transfer_blocks = Counter(
            "native_router:kv_transfer_blocks", "KV-cache blocks handed from prefill to decode workers", registry=r
        )
        self.transfer_seconds = Histogram(
            "native_router:kv_transfer_seconds",
            "Per request: the prefill worker's "
            "copy of the KV into the transfer file plus the decode worker's copy into "
            "its cache",
            buckets=TRANSFER_BUCKETS,
            registry=r,
        )

    @staticmethod
    def role(worker_id: str) -> str:
        return worker_id.split("-")[0]

    async def generate(self, request: web.Request) -> web.StreamResponse:
        raw = await read_body(request)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if isinstance(body, dict) and "kv_transfer" in body:
            return error_response(400, "kv_transfer is set by the coordinator; leave it out", "BadRequestError")
        if not isinstance(body, dict) or any(body.get(k) is not None for k in GRAMMAR_FIELDS):
            return await self.send(request, "decode", raw)  # the worker answers a malformed body with its 400
        first = await self.send(
            request, "prefill", json.dumps({**body, "stream": False, "kv_transfer": {"role": "prefill"}}).encode()
        )
        if first.status != 200:
            return first  # the engine's own answer: a 400 naming the field, a 503 when its queue is full
        kv = json.loads(first.body).get("kv_transfer") or {}
        if not kv.get("kv_file"):
            return error_response(
                502, "the prefill worker answered without its kv_transfer; see its log", "BadGatewayError"
            )
        try:
            return await self.send(request, "decode", json.dumps({**body, "kv_transfer": kv}).encode())
        finally:  # the decode worker deletes the file once mapped; one it never read goes here
            leftover = os.path.join(self.transfer_dir, os.path.basename(kv["kv_file"]))
            if os.path.exists(leftover):
                os.unlink(leftover)

    async def send(self, request: web.Request, role: str, raw: bytes) -> web.StreamResponse:
        """To the least busy worker of the role that is up; to another if it could not be reached at all."""
        tried = set()
        while True:
            candidates = [
                r for r in self.router.replicas.values() if self.role(r.id) == role and r.up and r.id not in tried
            ]
            if not candidates:
                return error_response(
                    503, f"no {role} worker is up; see the coordinator's log", "ServiceUnavailableError"
                )
            worker: Replica = min(candidates, key=lambda r: r.in_flight)
            try:
                return await self.router.forward(request, worker, raw, seen=self.account if role == "decode" else None)
            except ReplicaFailed as exc:
                self.router.metrics.failures.labels(worker.id, "mid_response" if exc.reached else "connect").inc()
                self.router.mark(worker, False, str(exc))
                if exc.reached:
                    return error_response(502, f"{role} worker {exc}; the request was lost with it", "BadGatewayError")
                tried.add(worker.id)

    def account(self, data: bytes) -> None:
        """The decode worker's last chunk (or whole answer) carries the handoff's cost in its timings."""
        if b'"kv_transfer_bytes"' not in data:
            return
        for event in data.split(b"\n\n"):
            try:
                timings = json.loads(event.removeprefix(b"data: ")).get("timings") or {}
            except (ValueError, AttributeError):
                continue
            if timings.get("kv_transfer_bytes"):
                self.transfer_bytes.inc(timings["kv_transfer_bytes"])
                self.transfer_blocks.inc(timings.get("kv_transfer_blocks") or 0)
                if timings.get("kv_import_ms") is not None:
                    self.transfer_seconds.observe((timings.get("kv_export_ms", 0) + timings["kv_import_ms"]) / 1e3)

    async def list_workers(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "policy": "disaggregated",
                "replicas": [
                    {
                        "id": r.id,
                        "role": self.role(r.id),
                        "url": r.url,
                        "up": r.up,
                        "in_flight": r.in_flight,
                        "pid": self.pids.get(r.id),
                    }
                    for r in self.router.replicas.values()
                ],
            }
        )

    def build_app(self) -> web.Application:
        """The router's endpoints, with generation and the worker listing the coordinator's own."""
        return self.router.build_app(generate=self.generate, list_replicas=self.list_workers)
