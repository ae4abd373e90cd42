"""Paired comparisons: each system against a baseline on the same questions.

Two systems answered the same questions, so their difference is read question by question, not
as a difference of two means with their own noise. For each metric the report shows the mean
per-question difference with a paired bootstrap 95% interval (`scipy.stats.bootstrap` with
`paired=True`, percentile method, 10,000 resamples, a fixed seed so a report rebuilds to the same
figures), and the exact two-sided sign test on the questions one system wins and the other loses.
On a 0/1 metric such as Cover EM that test is McNemar's exact test (a binomial test on the
discordant pairs); on F1 or support recall it is the sign test of the same form. With several
runs a question's value is its mean over runs. Questions where either system has no value (an
error, a metric undefined for that answer) are left out of that comparison, and the row says how
many pairs it rests on.

A percentile bootstrap collapses when few questions differ: at 0 wins / 4 losses every resample
has a difference <= 0, so its interval excludes 0 almost by construction while the exact McNemar
p is .125. So on a 0/1 metric with fewer than `FEW_DISCORDANT` discordant pairs the comparison
also carries Newcombe's interval for a difference of paired proportions (the square-and-add
Wilson score interval, his method 10: `newcombe_paired`), which stays honest there, and the
report shows it beside the bootstrap.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from rigkit.eval.aggregate import row_field

__all__ = ["PAIRED_METRICS", "PairedComparison", "Share", "paired_bootstrap", "mcnemar_exact",
           "compare_systems", "per_question", "wins_losses", "share_interval", "ratio_interval", "newcombe_paired",
           "FEW_DISCORDANT"]

PAIRED_METRICS = ("em_short", "em_open", "cover_em", "f1", "support_recall")
RESAMPLES = 10_000
CONFIDENCE = 0.95
FEW_DISCORDANT = 10  # below this many discordant pairs, a 0/1 metric also gets Newcombe's interval


@dataclass(frozen=True)
class PairedComparison:
    """`system` minus `baseline` on `metric` over the `pairs` questions both answered."""

    system: str
    baseline: str
    metric: str
    pairs: int
    difference: float
    low: float  # the bootstrap interval's ends
    high: float
    wins: int  # questions where the system scored higher than the baseline
    losses: int
    p_value: float  # exact two-sided sign test on wins vs losses (McNemar's on a 0/1 metric)
    # Newcombe's paired-proportion interval, on a 0/1 metric with < FEW_DISCORDANT discordant pairs
    newcombe: tuple[float, float] | None = None

    def interval_text(self) -> str:
        """The interval to read: Newcombe's where it was computed, else the bootstrap's."""
        if self.newcombe is not None:
            return f"[{self.newcombe[0]:+.3f}, {self.newcombe[1]:+.3f}] (Newcombe)"
        return f"[{self.low:+.3f}, {self.high:+.3f}]"


def paired_bootstrap(system: Sequence[float], baseline: Sequence[float], resamples: int = RESAMPLES,
                     confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float, float]:
    """(mean difference, interval low, interval high) of system - baseline, resampling questions."""
    a, b = np.asarray(system, dtype=float), np.asarray(baseline, dtype=float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError("a paired bootstrap needs two equal-length samples of at least 2 questions")
    difference = float(np.mean(a - b))
    if np.all(a - b == difference):  # every question differs alike: the interval is that point
        return difference, difference, difference
    result = stats.bootstrap((a, b), lambda x, y, axis=-1: np.mean(x - y, axis=axis), paired=True,
                             vectorized=True, n_resamples=resamples, confidence_level=confidence,
                             method="percentile", rng=np.random.default_rng(seed))
    interval = result.confidence_interval
    return difference, float(interval.low), float(interval.high)


@dataclass(frozen=True)
class Share:
    """A share over `n` questions with its bootstrap interval (questions resampled)."""

    value: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], resamples: int = RESAMPLES,
                   confidence: float = CONFIDENCE, seed: int = 0) -> Share | None:
    """sum(numerator) / sum(denominator) over questions, with a percentile bootstrap interval that
    resamples questions (each question's pair stays together); None when the denominator is 0."""
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if a.shape != b.shape or not a.size or b.sum() == 0:
        return None
    value = float(a.sum() / b.sum())
    if a.size < 2 or np.all(a == a[0]) and np.all(b == b[0]):
        return Share(value, value, value, int(a.size))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, a.size, size=(resamples, a.size))
    num, den = a[picks].sum(axis=1), b[picks].sum(axis=1)
    ratios = num[den > 0] / den[den > 0]
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return Share(value, float(low), float(high), int(a.size))


def share_interval(values: Sequence[float], **kwargs: Any) -> Share | None:
    """The mean of per-question values (a share when they are 0/1) with its bootstrap interval."""
    return ratio_interval(values, [1.0] * len(values), **kwargs)


def mcnemar_exact(wins: int, losses: int) -> float:
    """Exact two-sided p-value of `wins` against `losses` discordant pairs (1.0 with none)."""
    if wins + losses == 0:
        return 1.0
    return float(stats.binomtest(wins, wins + losses, 0.5, alternative="two-sided").pvalue)


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    centre = (successes + z * z / 2) / (n + z * z)
    half = z * np.sqrt(successes * (n - successes) / n + z * z / 4) / (n + z * z)
    return float(centre - half), float(centre + half)


def newcombe_paired(both: int, wins: int, losses: int, neither: int,
                    confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(difference, low, high) of two paired proportions: Newcombe's (1998) method 10.

    `both`: questions both systems got right; `wins`: only the first; `losses`: only the second;
    `neither`: both wrong. Each proportion gets its Wilson score interval; the two are combined by
    square-and-add with the correlation between them (its numerator continuity-corrected)."""
    n = both + wins + losses + neither
    if n == 0:
        raise ValueError("a paired interval needs at least one question")
    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
    first, second = both + wins, both + losses
    p1, p2 = first / n, second / n
    l1, u1 = _wilson(first, n, z)
    l2, u2 = _wilson(second, n, z)
    phi = 0.0
    if min(first, n - first, second, n - second) > 0:
        cross = both * neither - wins * losses
        numerator = cross - n / 2 if cross > n / 2 else (0.0 if cross >= 0 else cross)
        phi = numerator / float(np.sqrt(float(first) * (n - first) * second * (n - second)))
    d = p1 - p2
    low = d - np.sqrt(max((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2), 0.0))
    high = d + np.sqrt(max((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1), 0.0))
    return d, float(low), float(high)


def _binary_newcombe(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """Newcombe's interval when every value is 0 or 1 and fewer than FEW_DISCORDANT pairs differ."""
    if any(v not in (0.0, 1.0) for v in (*a, *b)):
        return None
    wins = sum(x > y for x, y in zip(a, b))
    losses = sum(x < y for x, y in zip(a, b))
    if wins + losses >= FEW_DISCORDANT:
        return None
    both = sum(x == y == 1.0 for x, y in zip(a, b))
    _, low, high = newcombe_paired(both, wins, losses, len(a) - both - wins - losses)
    return low, high


def per_question(rows: Iterable[dict[str, Any]], metric: str) -> dict[str, dict[str, float]]:
    """system -> question id -> the metric's mean over that question's runs."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        value = row.get(metric)
        if row.get("error") or row_field(row, "retrieval_failed") or not isinstance(value, (int, float)):
            continue
        values[row["system"]][str(row["id"])].append(float(value))
    return {system: {qid: statistics.fmean(v) for qid, v in by_id.items()} for system, by_id in values.items()}


def wins_losses(mine: dict[str, float], reference: dict[str, float]) -> tuple[int, int]:
    """Questions where `mine` scores above / below `reference`, over the questions both answered."""
    shared = set(mine) & set(reference)
    return sum(mine[q] > reference[q] for q in shared), sum(mine[q] < reference[q] for q in shared)


def compare_systems(rows: Sequence[dict[str, Any]], baseline: str = "rag",
                    metrics: Sequence[str] = PAIRED_METRICS) -> list[PairedComparison]:
    """Every other system against `baseline` on each metric, in the rows' system order."""
    systems = [s for s in dict.fromkeys(r["system"] for r in rows) if s != baseline]
    out = []
    for metric in metrics:
        table = per_question(rows, metric)
        reference = table.get(baseline, {})
        for system in systems:
            mine = table.get(system, {})
            shared = sorted(set(mine) & set(reference))
            if len(shared) < 2:
                continue
            a = [mine[q] for q in shared]
            b = [reference[q] for q in shared]
            difference, low, high = paired_bootstrap(a, b)
            wins, losses = wins_losses(mine, reference)
            out.append(PairedComparison(system, baseline, metric, len(shared), difference, low, high,
                                        wins, losses, mcnemar_exact(wins, losses), _binary_newcombe(a, b)))
    return out
