"""Ratios a user can trust: how every benchmark of ``ggml-bitcos bench`` (and ``ggml-bitcos demo``) turns
repeated, interleaved measurements into a ratio with its spread.

A benchmark measures in rounds: each round times every type once (A B C, A B C, ...), so a slow phase of a
shared machine lands on all types of that round alike. A ratio is taken per round (the candidate against the
reference of the same round) and reported as the median of those per-round ratios with their range
(min-max). When that range includes 1.0, or is wider (relative to the median) than the distance of the
median from 1.0, the spread is larger than the effect: the result is printed as "within noise" in words,
never as a bare ratio. A loss is judged as the inverse win, so the verdict does not depend on which type is
called the reference.
With one round there is no spread to judge by; the benchmarks ask for at least two (``rounds_type``).

Values without a ratio (tokens/s, µs) are printed as median with their range over the rounds, so a reader
sees the spread of every number.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

# the fewest rounds that give a ratio a spread
MIN_ROUNDS = 2


def rounds_type(text: str) -> int:
    """argparse `type` of ``--rounds``: an integer of at least MIN_ROUNDS (one round has no spread)."""
    n = int(text)
    if n < MIN_ROUNDS:
        raise argparse.ArgumentTypeError(f"--rounds {n}: at least {MIN_ROUNDS} rounds, or a ratio has no spread")
    return n


def add_rounds_argument(parser: argparse.ArgumentParser, default: int, what: str) -> None:
    """Adds ``--rounds`` (at least MIN_ROUNDS) to a benchmark's parser; `what` says what one round runs."""
    parser.add_argument(
        "--rounds",
        type=rounds_type,
        default=default,
        help=f"rounds, each running {what} once, interleaved; values are medians over rounds and ratios "
        f"are printed with their per-round range (default {default}, at least {MIN_ROUNDS})",
    )


@dataclass(frozen=True)
class RatioSpread:
    """Per-round ratios of a candidate to a reference, oriented so that > 1 means the candidate is faster."""

    ratios: tuple[float, ...]

    @property
    def rounds(self) -> int:
        return len(self.ratios)

    @property
    def median(self) -> float:
        return float(statistics.median(self.ratios)) if self.ratios else float("nan")

    @property
    def lo(self) -> float:
        return min(self.ratios) if self.ratios else float("nan")

    @property
    def hi(self) -> float:
        return max(self.ratios) if self.ratios else float("nan")

    @property
    def has_spread(self) -> bool:
        """Whether there are enough rounds to judge the ratio against its spread."""
        return self.rounds >= MIN_ROUNDS

    @property
    def within_noise(self) -> bool:
        """The rounds do not agree on a difference: their range includes 1.0, or it is wider (relative to the
        median) than the median's distance from 1.0. A loss is judged as the win it is the other way round
        (1 / ratio), so that A against B and B against A get the same verdict. False when there is no spread
        to judge by."""
        if not self.has_spread:
            return False
        if self.lo <= 1.0 <= self.hi:
            return True
        m, lo, hi = self.median, self.lo, self.hi
        if m < 1.0:
            m, lo, hi = 1.0 / m, 1.0 / hi, 1.0 / lo
        return (hi - lo) / m > m - 1.0

    def range_text(self) -> str:
        return f"{self.lo:.3f}-{self.hi:.3f}"

    def cell(self) -> str:
        """Table form: "1.250x (1.201-1.310)", "within noise (0.980x, 0.700-1.400)" or "1.250x (1 round)"."""
        if not self.ratios:
            return "-"
        if not self.has_spread:
            return f"{self.median:.3f}x ({self.rounds} round)"
        if self.within_noise:
            return f"within noise ({self.median:.3f}x, {self.range_text()})"
        return f"{self.median:.3f}x ({self.range_text()})"

    def sentence(self, what: str) -> str:
        """Prose form, `what` naming the ratio (e.g. "tg64: BITCOS / TQ2_0")."""
        if not self.ratios:
            return f"{what}: not measured"
        if not self.has_spread:
            return f"{what} = {self.median:.3f}x (one round: spread unknown)"
        rng = f"per-round range {self.range_text()} over {self.rounds} rounds"
        if self.within_noise:
            return f"{what}: no measurable difference: {self.median:.3f}x, {rng}, within noise"
        return f"{what} = {self.median:.3f}x ({rng})"

    def as_json(self) -> dict[str, Any]:
        """The spread for the benchmarks' --json files."""
        return {
            "median": self.median,
            "min": self.lo,
            "max": self.hi,
            "rounds": self.rounds,
            "per_round": list(self.ratios),
            "within_noise": self.within_noise,
        }


def speed_ratio(candidate: Sequence[float], reference: Sequence[float]) -> RatioSpread:
    """Per-round candidate / reference of a speed (tokens/s, GB/s: higher is faster); round i of one list
    pairs with round i of the other."""
    if len(candidate) != len(reference):
        raise ValueError(f"{len(candidate)} candidate rounds against {len(reference)} reference rounds")
    return RatioSpread(tuple(float(c) / float(r) for c, r in zip(candidate, reference)))


def time_ratio(reference: Sequence[float], candidate: Sequence[float]) -> RatioSpread:
    """Per-round reference / candidate of a time (µs, ticks: lower is faster), so that > 1 means the candidate
    is faster; round i of one list pairs with round i of the other."""
    return speed_ratio(reference, candidate)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def value_cell(values: Sequence[float], digits: int = 2) -> str:
    """A measured value over rounds: "30.46 (28.10-33.20)" (median, min-max); a single value alone."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def merge_rounds(
    runs: Sequence[Sequence[dict[str, Any]]],
    key: Callable[[dict[str, Any]], Hashable],
    field: str,
    rounds_field: str,
) -> list[dict[str, Any]]:
    """One record per key over several rounds of the same measurement: the first round's record (copied) with
    `field` = the median over rounds and `rounds_field` = the per-round values, in round order."""
    vals: dict[Hashable, list[float]] = {}
    for records in runs:
        for r in records:
            vals.setdefault(key(r), []).append(r[field])
    return [{**r, field: median(vals[key(r)]), rounds_field: vals[key(r)]} for r in runs[0]]
