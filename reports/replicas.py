"""Per-replica view of a deployment run: how the router spread the load, and how each replica's
prefix cache fared, from server_metrics.csv rows labelled `replica="<id>"` (harness/engine/server_metrics.py).

Counters are read as their increase from the first to the last scrape of the run (warm-ups
included, as the scraper runs around the whole load): requests the router sent each replica
(`native_router:requests_total`) and lost with it (`request_failures_total` but for refused
connects, which the router sends elsewhere), output tokens each generated (`bench:generation_tokens`),
the prefix-cache hit rate as hit / queried prompt tokens (`*:prefix_cache_{hits,queries}_total`, else
cached / all prompt tokens), and the router's decisions by reason. Gauges (running, waiting, KV use)
are summarised over the scrapes. A run without replica labels has no view (None).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from reports.load import RunData

REPLICA_LABEL = re.compile(r'(?:^|,)replica="([^"]*)"')
REASON_LABEL = re.compile(r'(?:^|,)reason="([^"]*)"')
POLICY_LABEL = re.compile(r'(?:^|,)policy="([^"]*)"')
ROLE = re.compile(r"^(.+)-\d+$")  # `prefill-0`: role `prefill`; `0`: no role
EVEN_SPLIT_TOLERANCE = 0.1  # a replica's share this far from 1/N still reads as an even split
GAUGES = {
    "bench:running": "requests running",
    "bench:waiting": "requests waiting",
    "bench:kv_usage_fraction": "KV cache in use (fraction)",
}


@dataclass
class ReplicaStats:
    replica: str
    requests: float | None  # the router's count; None where no router reported one (replica_metrics only)
    generation_tokens: float | None
    hit_rate: float | None  # prefix-cache hits / prompt tokens looked up, over the run
    mean_running: float | None
    peak_waiting: float | None
    peak_kv_fraction: float | None
    request_share: float | None = None
    token_share: float | None = None
    lost: float | None = None  # requests that failed once this replica had them (a refused connect is rerouted)


@dataclass
class ReplicaView:
    label: str
    replicas: list[ReplicaStats]
    series: pd.DataFrame  # t_s, value, replica, panel: the gauges and hit rate per scrape interval
    policy: str | None = None
    decisions: dict[str, float] = field(default_factory=dict)  # reason -> routing decisions over the run

    def imbalance(self) -> str:
        """One sentence: who served what share (requests, else output tokens) and each one's hit rate.
        Replicas named by role (`prefill-0`, `decode-0`: P/D disaggregation, where every request passes
        one of each) are compared within their role."""
        roles: dict[str, list[ReplicaStats]] = {}
        for r in self.replicas:
            named = ROLE.match(r.replica)
            roles.setdefault(named.group(1) if named else "", []).append(r)
        if len(roles) > 1:
            single = [members[0].replica for members in roles.values() if len(members) == 1]
            parts = (
                [f"one replica per role ({', '.join(single)})"]
                if len(single) == len(roles)
                else [f"{role}: {_split(members)}" for role, members in roles.items() if len(members) > 1]
            )
        else:
            parts = [_split(self.replicas)]
        rates = [f"{r.hit_rate:.2f} on replica {r.replica}" for r in self.replicas if r.hit_rate is not None]
        if rates:
            parts.append("prefix-cache hit rate " + ", ".join(rates))
        return f"{self.label}: " + "; ".join(parts) + "."


def _split(replicas: list[ReplicaStats]) -> str:
    """How requests (else output tokens) were shared among these replicas."""
    by_requests = all(r.requests is not None for r in replicas)
    values = [(r.replica, r.requests if by_requests else r.generation_tokens) for r in replicas]
    what = "requests" if by_requests else "output tokens"
    total = sum(v for _, v in values if v is not None)
    if any(v is None for _, v in values) or total <= 0:
        return f"the replicas reported no {what}"
    shares = [(rid, v / total) for rid, v in values]
    even = 1 / len(shares)
    if all(abs(share - even) <= EVEN_SPLIT_TOLERANCE for _, share in shares):
        return f"{what} were split evenly ({' / '.join(f'{share:.0%}' for _, share in shares)})"
    top, share = max(shares, key=lambda x: x[1])
    served = "served" if by_requests else "generated"
    return f"replica {top} {served} {share:.0%} of {what} (an even split is {even:.0%})"


def replica_id(labels: str) -> str | None:
    found = REPLICA_LABEL.search(labels or "")
    return found.group(1) if found else None


def _growth(part: pd.DataFrame, start_t: float | None = None) -> float | None:
    """A counter's increase over the run, summed over its label sets: last minus first value, where a
    label set first seen after `start_t` (the page's first scrape: a reason no decision had yet) began at 0."""
    if part.empty:
        return None
    start_t = part["t_s"].min() if start_t is None else start_t
    total = 0.0
    for _, series in part.sort_values("t_s").groupby("labels"):
        first = series["value"].iloc[0] if series["t_s"].iloc[0] <= start_t else 0.0
        total += series["value"].iloc[-1] - first
    return float(total)


def _hit_rate(rows: pd.DataFrame) -> tuple[float | None, pd.DataFrame]:
    """(hit rate over the run, per-interval hit rate series) of one replica's rows."""
    hits = rows[rows["name"].str.endswith("prefix_cache_hits_total") & ~rows["name"].str.contains("external")]
    queries = rows[rows["name"].str.endswith("prefix_cache_queries_total") & ~rows["name"].str.contains("external")]
    if hits.empty or queries.empty:  # other engines: the same pair in the schema (harness/engine/server_metrics.py)
        hits, queries = (
            rows[rows["name"] == "bench:prefix_cache_hits"],
            rows[rows["name"] == "bench:prefix_cache_queries"],
        )
    if hits.empty or queries.empty:
        return None, pd.DataFrame(columns=["t_s", "value"])
    both = (
        pd.concat(
            [hits.groupby("t_s")["value"].sum().rename("h"), queries.groupby("t_s")["value"].sum().rename("q")], axis=1
        )
        .dropna()
        .sort_index()
    )
    dq = both["q"].diff()
    per_interval = (both["h"].diff() / dq.where(dq > 0)).dropna()
    total_q = both["q"].iloc[-1] - both["q"].iloc[0]
    overall = float((both["h"].iloc[-1] - both["h"].iloc[0]) / total_q) if total_q > 0 else None
    return overall, pd.DataFrame({"t_s": per_interval.index, "value": per_interval.to_numpy()})


def replica_view(run: RunData, label: str | None = None) -> ReplicaView | None:
    frame = run.server_metrics
    if frame is None or "labels" not in frame:
        return None
    frame = frame.assign(labels=frame["labels"].fillna("").astype(str))
    frame = frame.assign(replica=frame["labels"].map(replica_id))
    routed = frame[frame["name"] == "native_router:requests_total"]
    router_start = frame[frame["name"].str.startswith("native_router:")]["t_s"].min()
    own = frame[frame["replica"].notna() & ~frame["name"].str.startswith("native_router:")]
    ids = list(dict.fromkeys(sorted(set(own["replica"]) | set(routed["replica"].dropna()), key=_natural)))
    if not ids:
        return None
    stats, series = [], []
    for rid in ids:
        rows = own[own["replica"] == rid]
        gauges = {name: rows[rows["name"] == name]["value"] for name in GAUGES}
        hit_rate, hit_series = _hit_rate(rows)
        stats.append(
            ReplicaStats(
                rid,
                _growth(routed[routed["replica"] == rid], router_start),
                _growth(rows[rows["name"] == "bench:generation_tokens"]),
                hit_rate,
                *(
                    float(agg(g)) if len(g) else None
                    for agg, g in (
                        (pd.Series.mean, gauges["bench:running"]),
                        (pd.Series.max, gauges["bench:waiting"]),
                        (pd.Series.max, gauges["bench:kv_usage_fraction"]),
                    )
                ),
            )
        )
        for name, panel in GAUGES.items():
            part = rows[rows["name"] == name]
            series.append(pd.DataFrame({"t_s": part["t_s"], "value": part["value"], "replica": rid, "panel": panel}))
        series.append(hit_series.assign(replica=rid, panel="prefix-cache hit rate (per interval)"))
    failed = frame[
        (frame["name"] == "native_router:request_failures_total")
        & frame["labels"].map(lambda labels: (REASON_LABEL.search(labels) or [0, ""])[1] != "connect")
    ]
    for s in stats if len(routed) else ():
        s.lost = _growth(failed[failed["replica"] == s.replica], router_start) or 0.0
    for attr, share in (("requests", "request_share"), ("generation_tokens", "token_share")):
        values = [getattr(s, attr) for s in stats]
        if all(v is not None for v in values) and sum(values) > 0:
            for s, v in zip(stats, values):
                setattr(s, share, v / sum(values))
    view = ReplicaView(label or run.label, stats, pd.concat(series, ignore_index=True))
    decisions = frame[frame["name"] == "native_router:routing_decisions_total"]
    for labels, part in decisions.groupby("labels"):
        reason = REASON_LABEL.search(labels)
        view.policy = view.policy or (POLICY_LABEL.search(labels) or [None, None])[1]
        view.decisions[reason.group(1) if reason else labels] = _growth(part, router_start) or 0.0
    return view


def _natural(replica: str):
    """Replica "10" after "2"."""
    return (0, int(replica), "") if replica.isdigit() else (1, 0, replica)


def replica_rows(views: list[ReplicaView]) -> list[list[str]]:
    """The Markdown/HTML table: a row per replica of each run."""

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    rows = []
    for v in views:
        for r in v.replicas:
            requests = "-" if r.requests is None else f"{r.requests:.0f} ({num(r.request_share, '.0%')})"
            tokens = "-" if r.generation_tokens is None else f"{r.generation_tokens:.0f} ({num(r.token_share, '.0%')})"
            rows.append(
                [
                    v.label,
                    r.replica,
                    requests,
                    num(r.lost, ".0f"),
                    tokens,
                    num(r.hit_rate, ".2f"),
                    num(r.mean_running, ".2f"),
                    num(r.peak_waiting, ".0f"),
                    num(r.peak_kv_fraction, ".2f"),
                ]
            )
    return rows


REPLICA_COLUMNS = (
    "run",
    "replica",
    "requests routed (share)",
    "lost there",
    "output tokens (share)",
    "prefix-cache hit rate",
    "mean running",
    "peak waiting",
    "peak KV use",
)


def decision_rows(views: list[ReplicaView]) -> list[list[str]]:
    return [[v.label, v.policy or "-", reason, f"{count:.0f}"] for v in views for reason, count in v.decisions.items()]
