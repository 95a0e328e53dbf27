"""Where did a nightly series change level, and was it a step or a slow drift?

Steps: e-divisive means (D. S. Matteson and N. A. James, "A Nonparametric Approach for Multiple Change
Point Analysis of Multivariate Data", JASA 109(505):334-345, 2014, section 2.2; the method MongoDB's and
DataStax's Hunter performance CI use). For every split of a segment into X (before) and Y (after) the
energy statistic
    Q = |X||Y| / (|X| + |Y|) * (2 mean|X - Y| - mean|X - X'| - mean|Y - Y'|)
is large when the two sides come from different distributions; the best split of the segment with the
largest Q is kept if a permutation test (the segment's values shuffled, the largest Q recomputed) says
such a Q is rare by chance (p <= ALPHA), and the search goes on in the pieces (hierarchical, as the
paper's E-Divisive). As in Hunter the segment end is fixed (the paper's kappa = the segment's end).
Nothing in scipy or the allowed dependencies does this; it is ~40 lines of numpy here.

A slow drift also produces change points (e-divisive cuts a ramp into pieces), so each change point is
then fitted two ways over its neighbouring segments: two flat levels (a step), or flat then a straight
line from a knot (a ramp). Whichever leaves the smaller squared error says what it was; neighbouring
ramp pieces are one drift. A finding is reported only when it is large as well as significant: a step
beyond the metric's threshold, a drift past half of it (it is still growing).

Only the last MAX_NIGHTS nights are searched: the search's time and memory grow with the square of the
nights (and a change older than a quarter is not news).

Values are compared on the log scale when all are positive: run-to-run noise is multiplicative and a
+15% step then looks the same at any level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_SEGMENT = 3  # nights on each side of a change point: fewer cannot tell a step from one odd night
PERMUTATIONS = 199
ALPHA = 0.01  # the permutation p-value a change point needs (199 permutations: p >= 0.005)
MAX_NIGHTS = 90  # the nights searched: a quarter's changes; a year takes ~10 s a metric on 2 cores, 90 under 1 s
MAX_CELLS = 2_000_000  # permuted series x n x n distances held at once
DRIFT_SHARE = 0.5  # a drift is reported once it has moved by this share of the step threshold


@dataclass
class Finding:
    kind: str  # "step" or "drift"
    index: int  # the first night at the new level (step) or the first night that drifted
    end: int  # the last night of the segment after it (for a drift: the last night it was seen)
    before: float  # the level before it, in the series' units
    after: float  # the level after it (a drift: where its line reaches at `end`)

    @property
    def change(self) -> float:
        return (self.after - self.before) / self.before if self.before else float("inf")

    def matches(self, other: Finding) -> bool:
        """The same change as seen on another night: one more night can move a step by one, and a drift's
        start by several (its fitted knot), so drifts match when they overlap."""
        if self.kind == other.kind == "drift":
            return self.index <= other.end + 1 and other.index <= self.end + 1
        return abs(self.index - other.index) <= 1


def energy_q(x: np.ndarray, min_size: int = MIN_SEGMENT) -> np.ndarray:
    """Q for every split of each row of x (R series of n values): Q[r, tau] splits row r into [:tau] and
    [tau:]; -inf where a side would be shorter than min_size. All rows at once via 2-D prefix sums."""
    r, n = x.shape
    q = np.full((r, n + 1), -np.inf)
    if n < 2 * min_size:
        return q
    d = np.abs(x[:, :, None] - x[:, None, :])
    s = np.zeros((r, n + 1, n + 1))
    s[:, 1:, 1:] = d.cumsum(axis=1).cumsum(axis=2)  # s[:, i, j]: sum of d over rows < i, columns < j
    tau = np.arange(min_size, n - min_size + 1)
    within_x = s[:, tau, tau] / 2  # pairs i < k, both before tau
    between = s[:, tau, n] - s[:, tau, tau]
    within_y = s[:, n, n, None] / 2 - between - within_x
    a, b = tau.astype(float), (n - tau).astype(float)
    e = 2 * between / (a * b) - within_x / (a * (a - 1) / 2) - within_y / (b * (b - 1) / 2)
    q[:, tau] = a * b / (a + b) * e
    return q


def e_divisive(
    x, min_size: int = MIN_SEGMENT, permutations: int = PERMUTATIONS, alpha: float = ALPHA, seed: int = 0
) -> list[int]:
    """Significant change points of x, sorted: each the index of the first value after a change."""
    x = np.asarray(x, dtype=float)
    rng = np.random.default_rng(seed)
    segments, points = [(0, x.size)], []
    while True:
        best = None  # (q, segment, split)
        for a, b in segments:
            q = energy_q(x[None, a:b], min_size)[0]
            tau = int(np.argmax(q))
            if np.isfinite(q[tau]) and (best is None or q[tau] > best[0]):
                best = (q[tau], (a, b), tau)
        if best is None:
            return sorted(points)
        q_seen, (a, b), tau = best
        shuffled = rng.permuted(np.tile(x[a:b], (permutations, 1)), axis=1)
        rows = max(1, MAX_CELLS // (b - a) ** 2)  # a year of nights: 199 x 365 x 365 would be 200 MB at once
        q_chance = np.concatenate(
            [energy_q(shuffled[i : i + rows], min_size).max(axis=1) for i in range(0, permutations, rows)]
        )
        p = (1 + np.count_nonzero(q_chance >= q_seen - 1e-12 * abs(q_seen))) / (permutations + 1)
        if p > alpha:
            return sorted(points)
        points.append(a + tau)
        segments.remove((a, b))
        segments += [(a, a + tau), (a + tau, b)]


def _rss(y: np.ndarray) -> float:
    return float(((y - y.mean()) ** 2).sum()) if y.size else 0.0


def _step(y: np.ndarray) -> tuple[float, int]:
    """Best two-level fit of y: (squared error, index of the first value of the second level)."""
    return min((_rss(y[:k]) + _rss(y[k:]), k) for k in range(1, y.size))


def _ramp(y: np.ndarray) -> tuple[float, int, np.ndarray]:
    """Best flat-then-line fit of y: (squared error, knot, fitted values); the line starts after the knot."""
    t = np.arange(y.size, dtype=float)
    best = (np.inf, 0, y)
    for knot in range(y.size - 1):
        design = np.column_stack([np.ones_like(t), np.maximum(0.0, t - knot)])
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        fit = design @ coef
        err = float(((y - fit) ** 2).sum())
        if err < best[0]:
            best = (err, knot, fit)
    return best


def findings(values, threshold: float, seed: int = 0, last: int = MAX_NIGHTS) -> list[Finding]:
    """Steps beyond `threshold` (relative) and drifts beyond DRIFT_SHARE of it among the `last` values, in night
    order; indices count from the first of all the values."""
    offset = max(0, len(values) - last)
    found = _findings(np.asarray(values[offset:], dtype=float), threshold, seed)
    for f in found:
        f.index, f.end = f.index + offset, f.end + offset
    return found


def _findings(raw: np.ndarray, threshold: float, seed: int) -> list[Finding]:
    log = bool(raw.size and (raw > 0).all())
    x = np.log(raw) if log else raw
    back = np.exp if log else (lambda v: v)
    points = e_divisive(x, seed=seed)
    bounds = [0] + points + [x.size]
    kinds = []
    for i in range(len(points)):
        a, b = bounds[i], bounds[i + 2]
        kinds.append("drift" if _ramp(x[a:b])[0] < _step(x[a:b])[0] else "step")
    out, i = [], 0
    while i < len(points):
        if kinds[i] == "step":
            a, b = bounds[i], bounds[i + 2]
            tau = a + _step(x[a:b])[1]  # the best split of the two fits: e-divisive's keeps MIN_SEGMENT a side
            found = Finding("step", tau, b - 1, float(back(x[a:tau].mean())), float(back(x[tau:b].mean())))
            if abs(found.change) >= threshold:
                out.append(found)
            i += 1
            continue
        j = i  # neighbouring ramp pieces make one drift: fit it once over all of them
        while j + 1 < len(points) and kinds[j + 1] == "drift":
            j += 1
        a, b = bounds[i], bounds[j + 2]
        _, knot, fit = _ramp(x[a:b])
        found = Finding("drift", a + knot + 1, b - 1, float(back(fit[knot])), float(back(fit[-1])))
        if abs(found.change) >= DRIFT_SHARE * threshold:
            out.append(found)
        i = j + 1
    return out
