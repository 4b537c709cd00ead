"""Three verdicts per point and metric: "no regression", "regression" or "undecided".

The change of a metric is the ratio B / A. Its estimate and interval come from the log of the ratio,
where a slowdown and a speed-up of the same factor are the same distance from nothing.

Measured alongside (interleaved, `interleave.py`): A and B ran in the same session, one pair per
round in ABBA order, so each round gives one paired log ratio d_k = ln(B_k / A_k). The interval is
Student's t on the mean of the d_k (n - 1 degrees of freedom). Anything that moved the machine
during a round (a neighbour, a clock, the page cache) moved both halves of its pair, and the ratio
cancels it; alternating which side runs first cancels a trend within the round too.

Not measured alongside (a stored baseline): A and B come from different periods, so nothing pairs
them. Welch's t on the difference of the mean log values is used, and every such verdict says "not
measured alongside": drift between the periods is charged to the image, and no statistic can take
it out (`tests/compare/test_verdicts.py` shows the false A/A that follows).

Deciding: with `alpha`, the two one-sided bounds of the (1 - 2 alpha) interval are each a one-sided
test at alpha, as in an equivalence test (TOST). With limit L = 1 - threshold for a metric where
higher is better (1 + threshold where lower is):
  - "regression" when the whole interval is worse than L (B is worse than the threshold, at alpha);
  - "no regression" when the whole interval is better than L (B is not worse than the threshold,
    at alpha; an improvement is "no regression" too, said in the change);
  - "undecided" otherwise, or with fewer than `min_rounds`, and with how many rounds would decide
    it at the spread seen (none can when the change sits on the limit).

Why this test: at n = 3 a one-sided exact Mann-Whitney test of 3 against 3 has one arrangement
that reaches p = 0.05 and none below it, so any overlap between the sides turns a real regression
into "within noise": a coin toss. A t interval on paired log ratios uses the size of every
difference, not only its rank; at n = 3 (t = 2.92 for alpha 0.05) and 2% noise per pair its
half-width is 3.4%, so a 10% threshold is decided either way when the change is a few per cent from
it. Looking again after each round makes the per-look alpha an underestimate of the error over the
whole sequence; `min_rounds` and a small `max_rounds` bound the number of looks, and a change near
the limit ends "undecided" rather than flipping to either side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

NO_REGRESSION = "no regression"
REGRESSION = "regression"
UNDECIDED = "undecided"
VERDICTS = (NO_REGRESSION, REGRESSION, UNDECIDED)
ALONGSIDE = "measured alongside"
NOT_ALONGSIDE = "not measured alongside"
MOST_ROUNDS_SAID = 1000  # beyond this "how many rounds would decide it" is answered "none at this spread"


@dataclass(frozen=True, kw_only=True)
class Policy:
    threshold: float = 0.10  # relative: 0.10 = ten per cent worse
    alpha: float = 0.05  # each one-sided bound
    min_rounds: int = 3  # below this the t quantile is too wide to decide anything useful (t(1) = 6.3)
    max_rounds: int = 8  # the budget: after this many rounds a point still open is "undecided"
    undecided_fails: bool = True  # whether a gate fails on "undecided" (the pipeline file says)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    change: float  # B / A - 1, from the mean log ratio
    low: float  # the (1 - 2 alpha) interval of `change`
    high: float
    n: int  # pairs (alongside), else the fewer repeats of the two sides
    spread: float  # the standard deviation of one log ratio (alongside) or of the difference (not)
    alongside: bool


@dataclass(frozen=True, kw_only=True)
class Decision:
    verdict: str
    estimate: Estimate | None
    rounds_to_decide: int | None  # undecided: rounds in all that would decide at this spread (None: none would)
    reason: str


def _t(alpha: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(1 - alpha, df))


def _mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0


def paired(a: Sequence[float], b: Sequence[float], alpha: float) -> Estimate | None:
    """A and B measured alongside: a[k] and b[k] are round k's pair (None: fewer than 2 pairs)."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need one A per B: {len(a)} against {len(b)}")
    if len(a) < 2 or min(*a, *b) <= 0:
        return None
    d = [math.log(y / x) for x, y in zip(a, b, strict=True)]
    mean, sd = _mean_sd(d)
    half = _t(alpha, len(d) - 1) * sd / math.sqrt(len(d))
    return Estimate(change=math.expm1(mean), low=math.expm1(mean - half), high=math.expm1(mean + half),
                    n=len(d), spread=sd, alongside=True)


def unpaired(a: Sequence[float], b: Sequence[float], alpha: float) -> Estimate | None:
    """A and B measured apart (a stored baseline): Welch's t on the mean log values."""
    if len(a) < 2 or len(b) < 2 or min(*a, *b) <= 0:
        return None
    (ma, sa), (mb, sb) = _mean_sd([math.log(x) for x in a]), _mean_sd([math.log(y) for y in b])
    va, vb = sa * sa / len(a), sb * sb / len(b)
    se = math.sqrt(va + vb)
    # Welch-Satterthwaite; with no spread on either side the interval is the point itself.
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1)) if se else 1.0
    half = _t(alpha, df) * se
    return Estimate(change=math.expm1(mb - ma), low=math.expm1(mb - ma - half), high=math.expm1(mb - ma + half),
                    n=min(len(a), len(b)), spread=se * math.sqrt(min(len(a), len(b))), alongside=False)


def limit(higher_is_better: bool, threshold: float) -> float:
    """The change beyond which B is worse than the threshold allows."""
    return -threshold if higher_is_better else threshold


def rounds_to_decide(est: Estimate, higher_is_better: bool, policy: Policy) -> int | None:
    """Pairs in all whose interval, at this spread and this change, would clear the limit."""
    gap = abs(math.log1p(est.change) - math.log1p(limit(higher_is_better, policy.threshold)))
    if gap == 0:
        return None
    for n in range(max(est.n + 1, 2), MOST_ROUNDS_SAID + 1):
        if _t(policy.alpha, n - 1) * est.spread / math.sqrt(n) < gap:
            return n
    return None


def decide(est: Estimate | None, higher_is_better: bool, policy: Policy) -> Decision:
    if est is None:
        return Decision(verdict=UNDECIDED, estimate=None, rounds_to_decide=policy.min_rounds,
                        reason="fewer than 2 measurements a side")
    lim = limit(higher_is_better, policy.threshold)
    worse_than_limit = est.high < lim if higher_is_better else est.low > lim
    within_limit = est.low > lim if higher_is_better else est.high < lim
    where = "alongside" if est.alongside else NOT_ALONGSIDE
    if est.n < policy.min_rounds:
        return Decision(verdict=UNDECIDED, estimate=est, rounds_to_decide=policy.min_rounds,
                        reason=f"{est.n} rounds, fewer than the {policy.min_rounds} a verdict needs")
    if worse_than_limit:
        return Decision(verdict=REGRESSION, estimate=est, rounds_to_decide=None,
                        reason=f"the whole interval is beyond {lim:+.0%} ({where})")
    if within_limit:
        return Decision(verdict=NO_REGRESSION, estimate=est, rounds_to_decide=None,
                        reason=f"the whole interval is within {lim:+.0%} ({where})")
    more = rounds_to_decide(est, higher_is_better, policy)
    need = (f"about {more} rounds in all would decide it at this spread" if more is not None
            else "the change sits on the threshold: no number of rounds decides it at this spread")
    return Decision(verdict=UNDECIDED, estimate=est, rounds_to_decide=more,
                    reason=f"the interval straddles {lim:+.0%} after {est.n} rounds; {need}")


def judge(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool, alongside: bool,
          policy: Policy) -> Decision:
    """One metric at one point: paired when measured alongside, else Welch on the two periods."""
    est = paired(a, b, policy.alpha) if alongside else unpaired(a, b, policy.alpha)
    return decide(est, higher_is_better, policy)


def worst(verdicts: Sequence[str]) -> str:
    """What a set of gated verdicts comes to: any regression, else any undecided, else none."""
    return REGRESSION if REGRESSION in verdicts else UNDECIDED if UNDECIDED in verdicts else NO_REGRESSION
