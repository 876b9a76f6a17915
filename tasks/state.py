"""The search state: the archive of what a run knows, parent selection, and breeding children.

The archive holds measured candidates and trusted forecasts (flagged; a forecast is never
reported as measured). Parents are chosen by an upper confidence bound over the archive:
a parent's value is its log speedup scaled to [0, 1] across the archive, plus an
exploration bonus that shrinks each time it is chosen, so good kernels are refined and
neglected ones still get tried.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

from kernelcast.kernels.records import Candidate, Measurement
from kernelcast.kernels.spaces import TemplateSpace
from kernelcast.surrogate.forecast import Forecast

TRUSTED_DISCOUNT = 0.05  # a forecast's log speedup counts a little below a measurement's


@dataclass
class Entry:
    candidate: Candidate
    measured: bool  # False: a trusted forecast
    status: str  # the measurement's status, or "forecast"
    speedup: float | None  # measured speedup, or the forecast's expected speedup when trusted
    visits: int = 0
    error: str = ""  # the measurement's error text (what a rewrite of its parent is told)
    precision: str = ""  # the measurement's precision verdict (kernelcast.kernels.harness.precision)

    @property
    def value(self) -> float | None:
        if not self.speedup or self.speedup <= 0 or self.status not in ("ok", "forecast"):
            return None
        return math.log(self.speedup) - (0.0 if self.measured else TRUSTED_DISCOUNT)


class Archive:
    """What one run has measured or trusted, keyed by candidate id."""

    def __init__(self, exploration: float = 0.5):
        self.exploration = exploration
        self.entries: dict[str, Entry] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, candidate_id: str) -> bool:
        return candidate_id in self.entries

    def add_measured(self, candidate: Candidate, m: Measurement) -> None:
        self.entries[candidate.candidate_id] = Entry(candidate, True, m.status, m.speedup, error=m.error,
                                                      precision=m.precision)

    def add_trusted(self, candidate: Candidate, f: Forecast) -> None:
        if candidate.candidate_id not in self.entries:  # a measurement is never replaced by a forecast
            self.entries[candidate.candidate_id] = Entry(candidate, False, "forecast", f.expected_speedup)

    def best(self) -> tuple[str | None, float | None]:
        """The best *measured* candidate and its speedup; (None, None) before any succeeds."""
        measured = [e for e in self.entries.values() if e.measured and e.status == "ok" and e.speedup]
        if not measured:
            return None, None
        top = max(measured, key=lambda e: (e.speedup, e.candidate.candidate_id))
        return top.candidate.candidate_id, top.speedup

    @property
    def measured_count(self) -> int:
        return sum(e.measured for e in self.entries.values())

    def parents(self) -> list[Entry]:
        return [e for e in self.entries.values() if e.value is not None]

    def select_parent(self, rng: random.Random, allowed: Callable[[Entry], bool] | None = None) -> Entry | None:
        """The parent with the highest upper confidence bound (among those ``allowed``); ties broken at random."""
        eligible = [e for e in self.parents() if allowed is None or allowed(e)]
        if not eligible:
            return None
        values = [e.value for e in eligible]
        lo, hi = min(values), max(values)
        total = sum(e.visits for e in eligible)
        scores = [(v - lo) / (hi - lo + 1e-12)
                  + self.exploration * math.sqrt(math.log(1 + total) / (1 + e.visits))
                  + 1e-9 * rng.random() for e, v in zip(eligible, values)]
        chosen = eligible[max(range(len(eligible)), key=scores.__getitem__)]
        chosen.visits += 1
        return chosen


def breed(space: TemplateSpace, archive: Archive, n: int, rng: random.Random, explore: float,
          exclude: set[str], crossover: float = 0.3) -> list[Candidate]:
    """Up to ``n`` new children: mutations and crossovers of archive parents, plus fresh variants.

    ``exclude`` holds ids already decided in this run; a child is never one of them nor a
    repeat. Fewer than ``n`` come back only when the space has run out of new variants.
    """
    seen = set(exclude) | set(archive.entries)
    children: list[Candidate] = []
    fresh = {v.candidate_id: v for v in space.variants() if v.candidate_id not in seen}  # in space order
    for _ in range(20 * n):
        if len(children) >= n or not fresh:
            break
        parent = archive.select_parent(rng) if rng.random() >= explore else None
        if parent is None:
            child = rng.choice(list(fresh.values()))
        elif rng.random() < crossover and len(archive.parents()) >= 2:
            other = archive.select_parent(rng)
            child = space.crossover(parent.candidate, other.candidate, rng)
        else:
            child = space.mutate(parent.candidate, rng)
        if child.candidate_id in seen:
            continue
        seen.add(child.candidate_id)
        fresh.pop(child.candidate_id, None)
        children.append(child)
    return children
