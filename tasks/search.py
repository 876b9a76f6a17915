"""The search loop as plain Python: one ``Search`` per run, one method per step.

generate -> forecast -> select -> measure -> update, once per generation. Prefect wraps
each method as a task (``tasks/steps.py``); benchmarks and tests call them directly.

Everything a run decides is journaled under the data root (candidates, forecasts,
decisions, measurements, and a generation row written last, as the commit mark), and
every step is deterministic given the journal: a generation's random draws come from
(seed, generation), forecasts are read back from the journal, measurements already
stored are reused rather than taken again. Rerunning a run id therefore replays the
finished generations from the journal, without GPU time, and continues after the last
one; a measured candidate is never measured twice and never lost.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from threadpoolctl import threadpool_limits

from kernelcast.kernels.formats import is_imported_name
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import Candidate, Decision, GenerationSummary, Measurement, SearchRun
from kernelcast.kernels.spaces import get_space
from kernelcast.storage.dataset import DataRoot
from kernelcast.storage.schema import candidates_from_frame, forecasts_from_frame, measurements_from_frame, records_from_frame
from kernelcast.surrogate.bins import speedup_bin
from kernelcast.surrogate.forecast import Forecast
from kernelcast.surrogate.online import SearchSurrogate, log_expected_improvement, thompson_draw
from kernelcast.surrogate.policies import BudgetPolicy, ConformalRiskPolicy, Selection, ThresholdPolicy, run_weighted
from kernelcast.tasks.config import ConfigError, SearchConfig, changed_settings
from kernelcast.tasks.generators import make_generator
from kernelcast.tasks.context import SearchContext
from kernelcast.tasks.state import Archive

_FLUSH_EVERY = 8  # measurements buffered before a write
# Why a search ends: its budget is spent ("budget": measurements; "gpu_seconds", "gpu_compile_seconds": a
# budget of that kind, or the GPU-seconds cap on a measurements budget), its generator has no new candidates
# left (template space or replay corpus exhausted), or it ran all its generations.
STOP_REASONS = ("budget", "gpu_seconds", "gpu_compile_seconds", "no candidates", "generations")


@dataclass
class Generation:
    """What one generation produced, in memory, step by step."""

    index: int
    budget: int
    children: list[Candidate] = field(default_factory=list)
    forecasts: list[Forecast] = field(default_factory=list)
    selection: Selection = field(default_factory=Selection)
    measurements: list[Measurement] = field(default_factory=list)
    reused: int = 0
    generator_counts: object = None  # kernelcast.tasks.llm_generator.GeneratorCounts of an LLM generator's answers
    skipped: list = field(default_factory=list)  # kernelcast.kernels.variants.Skipped: variants that could not apply
    started: float = field(default_factory=time.perf_counter)
    forecast_seconds: float = 0.0
    measure_seconds: float = 0.0


@dataclass(frozen=True)
class SearchResult:
    run_id: str
    op: str
    gpu_type: str
    best_candidate_id: str | None
    best_speedup: float | None  # measured, never a forecast
    best_source: str
    best_params: dict
    budget_used: int
    gpu_seconds: float
    generations: tuple[GenerationSummary, ...]
    replayed: bool  # measurements came from a measured pool, not a live GPU
    stop_reason: str = "generations"  # one of STOP_REASONS: what ended the search
    best_precision: str = ""  # the best kernel's precision verdict: "lower: ..." when below the reference's class


class Search:
    """One search run over one operation on one GPU type."""

    def __init__(self, config: SearchConfig, root: DataRoot, pool, forecaster=None, tracker=None):
        # What every step reads: the config the setup validated and settled, and the data root it opened, once.
        self.context = SearchContext(config, root)  # refuses a config whose GPU type or run id is unsettled
        self.config = config
        self.root = root
        self.pool = pool
        self.forecaster = forecaster
        self.tracker = tracker
        # An imported task has no template space: its children come from the LLM generator alone.
        self.space = None if is_imported_name(config.op) else get_space(config.op)
        self.generator = make_generator(config)
        self.generator.probe()  # an unreachable endpoint or a missing corpus fails here, before any GPU time
        self.archive = Archive()
        self.candidates: dict[str, Candidate] = {}
        self.calibration: list[tuple[Forecast, int]] = []  # (forecast, measured bin) of this run
        self.summaries: list[GenerationSummary] = []
        self.trajectory: list[float] = []  # measured speedups in the order they were charged (0: failed)
        self.charges: list[float] = []  # the GPU-seconds each of those measurements charged
        self.compile_charges: list[float] = []  # the compile seconds each of them charged
        self.charged_ids: list[str] = []  # the candidate each of them was
        self.seconds_by_origin: dict[str, list[float]] = {}  # GPU + compile seconds of the children measured, by origin
        self.spent_each: list[float] = []  # what each of them cost in the budget's units (config.charge)
        self.budget_used = 0  # measurements charged
        self.gpu_seconds = 0.0
        self.compile_seconds = 0.0
        self.budget_spent = 0.0  # in the budget's units (config.budget_kind)
        self.reference_charge = 0.0  # what measuring the reference cost, in the budget's units
        self.carry = 0  # budget a generation left unspent passes to the next
        self.completed: set[int] = set()
        self.surrogate: SearchSurrogate | None = None
        self.mlflow_run: str | None = None
        self.replayed = False

    # ---- setup ---------------------------------------------------------------------------

    @classmethod
    def of(cls, context: SearchContext, pool, forecaster=None, tracker=None) -> "Search":
        """A search on a context the setup resolved (``kernelcast.tasks.setup.open_context``)."""
        search = cls(context.config, context.root, pool, forecaster, tracker)
        search.context = context
        return search

    def start(self) -> "Search":
        """Register (or resume) the run, measure the op's reference, and open tracking."""
        c = self.config
        check_resume(self.root, c)
        self.root.write_records([SearchRun(c.run_id, c.op, c.gpu_type, c.to_json())])
        self.hardware = self.pool.prepare(c.op, c.gpu_type)
        done = self.root.read_run_rows("generations", c.run_id, op=c.op)
        self.completed = set(int(g) for g in done["generation"]) if not done.empty else set()
        reference = get_operation(c.op).seed_candidates()[0]
        self.root.write_candidates([reference])
        ref = self._measure([reference])[0][0]
        self.replayed = ref.replayed
        self.reference_charge = c.charge(ref)
        if ref.status != "ok" and ref.mode != "interpreter":
            raise RuntimeError(f"the {c.op} reference failed to measure on {c.gpu_type}: {ref.status}: {ref.error}")
        if self.forecaster is not None:
            self.surrogate = SearchSurrogate(self.forecaster, c.op, self.hardware, ref.runtime_us_median)
        if self.tracker is not None:
            params = {k: v for k, v in dataclasses.asdict(c).items() if k not in ("storage_options",)}
            self.mlflow_run = self.tracker.start(c.run_id, params, tags={
                "op": c.op, "gpu_type": c.gpu_type, "surrogate": c.surrogate, "policy": c.policy,
                "generator": c.generator, "acquisition": c.acquisition, "budget": str(c.budget), "seed": str(c.seed),
                "baseline": str(not c.surrogate_on).lower(), "replayed": str(self.replayed).lower()})
        return self

    # ---- the five steps --------------------------------------------------------------------

    def plan(self, g: int) -> Generation:
        """Generation ``g`` with its budget in measurements: its share plus what earlier generations left; with a
        budget in seconds, its share of the seconds left over what a measurement has cost so far (the reference's
        at first), the waves of ``measure`` stopping where the seconds run out."""
        c = self.config
        if not c.budget_in_seconds:
            return Generation(g, c.generation_budgets()[g] + self.carry)
        share = max(0.0, c.budget - self.budget_spent) / max(1, c.generations - g)
        costs = [x for x in self.spent_each if x > 0] or ([self.reference_charge] if self.reference_charge > 0 else [])
        count = c.children if not costs else math.ceil(share / (sum(costs) / len(costs)))
        return Generation(g, max(1, min(c.children, count)))

    def generate(self, gen: Generation) -> list[Candidate]:
        c = self.config
        rng = random.Random(f"{c.seed}:{gen.index}")
        n = c.children_for(gen.budget)
        # Children dropped in an earlier generation may come back: the surrogate knows more now.
        explore = c.explore if len(self.archive) else 1.0
        provenance = []
        if gen.index in self.completed and not self.generator.repeatable:
            gen.children = self._journal_children(gen.index)  # a model answers differently each time
        else:
            made = self.generator.children(c.op, self.space, self.archive, n, rng, explore, seed=c.seed,
                                           run_id=c.run_id, generation=gen.index)
            gen.children, gen.generator_counts, provenance = made.children, made.counts, made.provenance
            gen.skipped = made.skipped
        for child in gen.children:
            self.candidates.setdefault(child.candidate_id, child)
        self.root.write_candidates(gen.children)
        if provenance and gen.index not in self.completed:
            self.root.write_records(provenance)
        return gen.children

    def forecast(self, gen: Generation) -> list[Forecast]:
        if self.surrogate is None or not gen.children:
            return []
        t0 = time.perf_counter()
        journal = self._journal_forecasts(gen.index)
        if journal is not None and set(journal) >= {ch.candidate_id for ch in gen.children}:
            gen.forecasts = [journal[ch.candidate_id] for ch in gen.children]
        else:
            with threadpool_limits(limits=1, user_api="openmp"):  # see kernelcast.tasks.setup.fit_prior
                gen.forecasts = self.surrogate.forecast(gen.children)
            self.root.write_forecasts(gen.forecasts, self.config.run_id, gen.index, self.config.op,
                                      self.config.gpu_type)
        gen.forecast_seconds = time.perf_counter() - t0
        return gen.forecasts

    def expected_cost(self, candidate_id: str) -> float:
        """The GPU plus compile seconds a child like this one has cost in this run: the median of the measured
        children of its origin (a torch.compile mode, a CUDA graph, a model's rewrite), else of every one."""
        mine = self.seconds_by_origin.get(self.candidates[candidate_id].origin)
        every = mine or [x for costs in self.seconds_by_origin.values() for x in costs]
        return statistics.median(every) if every else 1.0

    def select(self, gen: Generation) -> Selection:
        # A search's roots (a pool's kernels it starts from) are its starting point, not candidates to weigh:
        # measured first by every search, the equal-budget baseline and the surrogate's alike (unless weigh_roots).
        roots = set() if self.config.weigh_roots else {c.candidate_id for c in getattr(self.generator, "roots", ())}
        pending = [ch.candidate_id for ch in gen.children if ch.candidate_id in roots]
        forced, late = pending[: gen.budget], pending[gen.budget:]
        rest = [ch for ch in gen.children if ch.candidate_id not in roots]
        budget = gen.budget - len(forced)
        if self.surrogate is None:
            gen.selection = Selection(measure=forced + [ch.candidate_id for ch in rest[:budget]],
                                      drop=[ch.candidate_id for ch in rest[budget:]] + late)
        else:
            _, best = self.archive.best()
            chosen = select_children(self.config, [f for f in gen.forecasts if f.candidate_id not in roots],
                                     best or 0.0, gen.index, budget, self.calibration, self.expected_cost,
                                     measured_first=[f for f in gen.forecasts if f.candidate_id in forced])
            gen.selection = dataclasses.replace(chosen, measure=forced + chosen.measure, drop=chosen.drop + late)
        return gen.selection

    def measure(self, gen: Generation) -> list[Measurement]:
        """The selected children, measured; with a budget in seconds (or a GPU-seconds cap), in waves of
        ``measure_wave``, and the children of the waves after the one that spends it dropped unmeasured."""
        c = self.config
        t0 = time.perf_counter()
        wanted = [self.candidates[i] for i in gen.selection.measure]
        waves = c.budget_in_seconds or c.gpu_seconds_budget
        wave = c.measure_wave if waves else max(1, len(wanted))
        gen.measurements, gen.reused = [], 0
        spent, gpu = self.budget_spent, self.gpu_seconds
        for start in range(0, len(wanted), wave):
            if (c.budget_in_seconds and spent >= c.budget) or (c.gpu_seconds_budget and gpu >= c.gpu_seconds_budget):
                break
            measured, reused = self._measure(wanted[start: start + wave])
            gen.measurements += measured
            gen.reused += reused
            spent += sum(c.charge(m) for m in measured)
            gpu += sum(m.gpu_seconds for m in measured)
        if len(gen.measurements) < len(wanted):  # a measure decision is a charged measurement: the rest are drops
            s = gen.selection
            gen.selection = dataclasses.replace(s, measure=s.measure[: len(gen.measurements)],
                                                drop=s.drop + s.measure[len(gen.measurements):])
        gen.measure_seconds = time.perf_counter() - t0
        return gen.measurements

    def update(self, gen: Generation) -> GenerationSummary:
        c = self.config
        for m in gen.measurements:
            self.archive.add_measured(self.candidates[m.candidate_id], m)
        by_id = {f.candidate_id: f for f in gen.forecasts}
        for cid in gen.selection.trust:
            self.archive.add_trusted(self.candidates[cid], by_id[cid])
        if self.surrogate is not None:
            self.surrogate.update(self.candidates, gen.forecasts, gen.measurements)
        measured_bins = {m.candidate_id: speedup_bin(m.speedup if m.status == "ok" else None)
                         for m in gen.measurements}
        forecast_hits = [(by_id[cid].predicted_bin, b) for cid, b in measured_bins.items() if cid in by_id]
        self.calibration += [(by_id[cid], b) for cid, b in measured_bins.items() if cid in by_id]
        charged = len(gen.measurements)
        self.trajectory += [m.speedup if m.status == "ok" and m.speedup else 0.0 for m in gen.measurements]
        self.charges += [m.gpu_seconds for m in gen.measurements]
        self.compile_charges += [m.compile_seconds for m in gen.measurements]
        self.charged_ids += [m.candidate_id for m in gen.measurements]
        for m in gen.measurements:
            self.seconds_by_origin.setdefault(self.candidates[m.candidate_id].origin, []).append(
                m.gpu_seconds + m.compile_seconds)
        self.spent_each += [c.charge(m) for m in gen.measurements]
        gen_gpu = sum(m.gpu_seconds for m in gen.measurements)
        gen_compile = sum(m.compile_seconds for m in gen.measurements)
        self.budget_used += charged
        self.gpu_seconds += gen_gpu
        self.compile_seconds += gen_compile
        self.budget_spent += sum(c.charge(m) for m in gen.measurements)
        self.carry = 0 if c.budget_in_seconds else max(0, gen.budget - charged)
        best_id, best = self.archive.best()
        wall = time.perf_counter() - gen.started
        summary = GenerationSummary(
            run_id=c.run_id, generation=gen.index, op=c.op, gpu_type=c.gpu_type, surrogate=c.surrogate,
            policy=c.policy if c.surrogate_on else "measure-all", generated=len(gen.children),
            forecast=len(gen.forecasts), measured=charged, reused=gen.reused, trusted=len(gen.selection.trust),
            dropped=len(gen.selection.drop), failed=sum(m.status != "ok" for m in gen.measurements),
            budget_used=self.budget_used, budget_left=0 if c.budget_in_seconds else c.budget - self.budget_used,
            gpu_seconds=gen_gpu, gpu_seconds_total=self.gpu_seconds, budget_kind=c.budget_kind,
            budget_spent=self.budget_spent, budget_remaining=max(0.0, c.budget - self.budget_spent),
            compile_seconds=gen_compile, compile_seconds_total=self.compile_seconds, best_candidate_id=best_id, best_speedup=best,
            surrogate_bin_accuracy=_mean([p == b for p, b in forecast_hits]),
            surrogate_within_one=_mean([abs(p - b) <= 1 for p, b in forecast_hits]),
            wall_seconds=wall, overhead_seconds=max(0.0, wall - gen.forecast_seconds - gen.measure_seconds),
            **_generator_fields(gen.generator_counts))
        if gen.index in self.completed:  # replayed from the journal: keep the stored summary
            stored = self.root.read_run_rows("generations", c.run_id, op=c.op)
            row = stored[stored["generation"] == gen.index]
            summary = records_from_frame(GenerationSummary, row)[0] if not row.empty else summary
        else:
            self._write_decisions(gen)
            self.root.write_records([summary])  # last: the generation's commit mark
            if self.tracker is not None:
                self.tracker.log_generation(self.mlflow_run, summary)
        self.summaries.append(summary)
        return summary

    def run_generation(self, g: int) -> GenerationSummary:
        gen = self.plan(g)
        self.generate(gen)
        self.forecast(gen)
        self.select(gen)
        self.measure(gen)
        return self.update(gen)

    def should_stop(self) -> str:
        """Why the search ends before its next generation (one of ``STOP_REASONS``), or '' if it goes on."""
        c = self.config
        if c.budget_in_seconds and self.budget_spent >= c.budget:
            return c.budget_kind
        if not c.budget_in_seconds and self.budget_used >= c.budget:
            return "budget"
        if c.gpu_seconds_budget and self.gpu_seconds >= c.gpu_seconds_budget:
            return "gpu_seconds"
        if self.generator.exhausted(self.space, self.archive):
            return "no candidates"
        return ""

    def run(self) -> SearchResult:
        """Every generation in order (finished ones replayed from the journal), then the result."""
        for g in range(self.config.generations):
            if self.should_stop():
                break
            self.run_generation(g)
        return self.finish()

    def finish(self) -> SearchResult:
        """The run's result: its best measured kernel, what it spent, and why it stopped."""
        best_id, best = self.archive.best()
        best_c = self.candidates.get(best_id) if best_id else None
        result = SearchResult(self.config.run_id, self.config.op, self.config.gpu_type, best_id, best,
                              best_c.source if best_c else "", dict(best_c.params) if best_c else {},
                              self.budget_used, self.gpu_seconds, tuple(self.summaries), self.replayed,
                              self.should_stop() or "generations",
                              self.archive.entries[best_id].precision if best_id else "")
        if self.tracker is not None and self.mlflow_run:
            from kernelcast.tasks.report import search_artifacts

            self.tracker.log_files(self.mlflow_run, search_artifacts(result, self.root))
            self.tracker.finish(self.mlflow_run, tags={"best_candidate_id": best_id or "",
                                                       "stop_reason": result.stop_reason,
                                                       "best_precision": result.best_precision,
                                                       "best_speedup": f"{best:.4f}" if best else ""})
        return result

    # ---- helpers ---------------------------------------------------------------------------

    def _journal_children(self, g: int) -> list[Candidate]:
        """Generation ``g``'s children as the journal has them, in the order they were decided."""
        rows = self.root.read_run_rows("decisions", self.config.run_id, op=self.config.op)
        ids = list(dict.fromkeys(rows.loc[rows["generation"] == g, "candidate_id"])) if not rows.empty else []
        table = self.root.read_candidates(op=self.config.op)
        found = {ch.candidate_id: ch for ch in candidates_from_frame(table[table["candidate_id"].isin(ids)])}
        return [found[i] for i in ids if i in found]

    def _journal_forecasts(self, g: int) -> dict[str, Forecast] | None:
        if g not in self.completed:
            return None
        rows = self.root.read_run_rows("forecasts", self.config.run_id, op=self.config.op)
        rows = rows[rows["generation"] == g]
        return {f.candidate_id: f for f in forecasts_from_frame(rows)} if not rows.empty else None

    def _measure(self, candidates: Sequence[Candidate]) -> tuple[list[Measurement], int]:
        """Measurements of ``candidates`` in order, each held to the search's precision mode, and how many were
        reused from storage (or a replayed pool, whose rows keep the verdict they were measured with)."""
        found, reused = measure_and_store(self.root, self.pool, candidates, self.config.gpu_type)
        return [found[ch.candidate_id].held_to(self.config.precision) for ch in candidates], reused

    def _write_decisions(self, gen: Generation) -> None:
        c = self.config
        by_id = {f.candidate_id: f for f in gen.forecasts}
        policy = c.policy if c.surrogate_on else "measure-all"
        rows = []
        for kind, ids in (("measure", gen.selection.measure), ("trust", gen.selection.trust),
                          ("drop", gen.selection.drop)):
            for cid in ids:
                f = by_id.get(cid)
                rows.append(Decision(c.run_id, gen.index, cid, c.op, c.gpu_type, kind, policy,
                                     parent_id=self.candidates[cid].parent_id,
                                     predicted_bin=f.predicted_bin if f else 0,
                                     expected_speedup=f.expected_speedup if f else None,
                                     confidence=f.max_probability if f else None))
        self.root.write_records(rows)


def trust_policy(config: SearchConfig, calibration: Sequence[tuple[Forecast, int]] = ()) -> ThresholdPolicy:
    """The policy that says which forecasts a search trusts: a confidence threshold, or a conformal one
    certified on ``calibration`` (the run's measured forecasts and their measured bins)."""
    if config.policy == "budget":
        return ThresholdPolicy("max_probability", config.trust_threshold)
    policy = ConformalRiskPolicy(config.target_risk)
    if calibration:  # until this run has measured forecasts, nothing is certified: trust nothing
        forecasts, bins = zip(*calibration)
        policy.fit(forecasts, bins)
    return policy


def check_resume(root: DataRoot, c: SearchConfig) -> None:
    """A run id already in ``root`` is resumed as what it is, or refused naming what differs: another operation
    or GPU type, or other search settings (``kernelcast.tasks.config.changed_settings``)."""
    runs = root.read("runs")
    mine = runs[runs["run_id"] == c.run_id] if not runs.empty else runs
    if mine.empty:
        return
    row = mine.iloc[0]
    if (row["op"], row["gpu_type"]) != (c.op, c.gpu_type):
        raise ConfigError(f"run id {c.run_id!r} belongs to a search of {row['op']} on {row['gpu_type']}, "
                          f"not {c.op} on {c.gpu_type}; choose another run id")
    changed = changed_settings(row.get("config", ""), c)
    if changed:
        raise ConfigError(f"run id {c.run_id!r} was started with other settings ({'; '.join(changed[:6])}); "
                          "resume it with its own settings, or choose another run id")


def select_children(config: SearchConfig, forecasts: Sequence[Forecast], best: float, generation: int, budget: int,
                    calibration: Sequence[tuple[Forecast, int]] = (),
                    cost: Callable[[str], float] | None = None,
                    measured_first: Sequence[Forecast] = ()) -> Selection:
    """Which forecast children generation ``generation`` of a search measures, trusts and drops, given
    the best measured speedup so far and ``budget`` measurements: the search's own choice, which
    ``kernelcast forecast`` also reports.

    ``measured_first``: the forecasts of kernels this generation measures before its children whatever they
    forecast (a search's roots). Where one is trusted and gives a point, the children are weighed against it as
    against the best so far: a child surely slower than a root measured beside it is no new best."""
    trust = trust_policy(config, calibration)
    best = max([best, *(f.expected_speedup for f in measured_first if f.has_point and trust.trusted(f))])
    key = f"{config.seed}:{generation}"  # a resumed run draws what the interrupted one drew
    if config.acquisition == "ei-per-second":  # per second: a cheap child may be worth more than a likelier dear one
        price = cost or (lambda candidate_id: 1.0)
        rank = lambda f: log_expected_improvement(f, best) - math.log(max(price(f.candidate_id), 1e-6))  # noqa: E731
    elif config.acquisition == "ei":
        rank = lambda f: log_expected_improvement(f, best)  # noqa: E731
    else:
        rank = lambda f: thompson_draw(f, key)  # noqa: E731
    rank = run_weighted(rank)  # a child that fails gains nothing (no change where failure is not forecast)
    # The last generation's budget is lost if unspent: children forecast to fail are measured then.
    last = generation == config.generations - 1
    policy = BudgetPolicy(budget, trust, rank=rank, spend_all=last)
    return policy.select(forecasts, best)


def _generator_fields(counts) -> dict:
    """The generation row's generator columns: asked, kept, and dropped by each static-check reason."""
    if counts is None:
        return {}
    from kernelcast.kernels.screen import SCREEN_REASONS

    return {"generator_asked": counts.asked, "generator_children": counts.children,
            **{f"screened_{r}": counts.screened[r] for r in SCREEN_REASONS}}


def screened_text(summary: GenerationSummary) -> str:
    """A generation's static-check drops as 'reason n, ...' (or 'none')."""
    from kernelcast.kernels.screen import SCREEN_REASONS

    parts = [f"{r} {getattr(summary, f'screened_{r}')}" for r in SCREEN_REASONS
             if getattr(summary, f"screened_{r}", 0)]
    return ", ".join(parts) or "none"


def _mean(values: list) -> float | None:
    return sum(values) / len(values) if values else None


def _adopt_references(pool, todo: Sequence[Candidate], gpu_type: str, frames: dict) -> None:
    """Give the pool each op's reference as the data root stored it (its latest ok row timed on a GPU), before it
    measures that op's candidates: every run and every worker of one root then sets its candidates against the same
    reference runtime and times the same cases beside it, where each measuring its own reference would decide its
    paired cases afresh and take that moment's host speed (docs/measured/harness_repeatability/README.md, "Repeatability both ways"). A pool that
    cannot adopt it (a replay, a row from other hardware or from before rows said which cases were host-sensitive)
    measures its own, as before; the reference itself asked for is measured, not adopted."""
    adopt = getattr(pool, "adopt_reference", None)
    asked = {ch.candidate_id for ch in todo}
    for op in sorted({ch.op for ch in todo}) if adopt is not None else ():
        ref_id = get_operation(op).seed_candidates()[0].candidate_id
        frame = frames.get(op)
        if ref_id in asked or frame is None or frame.empty:
            continue
        rows = [m for m in measurements_from_frame(frame[frame["candidate_id"] == ref_id])
                if m.status == "ok" and m.mode == "gpu" and not m.replayed]
        if rows:
            adopt(max(rows, key=lambda m: m.measured_at), gpu_type)


def measure_and_store(root: DataRoot, pool, candidates: Sequence[Candidate], gpu_type: str,
                      reuse: bool = True) -> tuple[dict[str, Measurement], int]:
    """Each candidate's measurement on ``gpu_type``: stored ones reused, the rest measured and written as they come.

    Results are written in small batches while measuring, and whatever was measured is
    written even when the backend fails part way, so a rerun never pays for it again.
    """
    wanted = {ch.candidate_id for ch in candidates}
    ops = sorted({ch.op for ch in candidates})
    frames = {op: root.read_measurements(op=op, gpu_type=gpu_type) for op in ops}
    stored: dict[str, Measurement] = {}
    for op in ops if reuse else ():
        frame = frames[op]
        if not frame.empty:
            frame = frame[frame["candidate_id"].isin(wanted)]
            stored.update((m.candidate_id, m) for m in measurements_from_frame(frame))
    todo = [ch for ch in candidates if ch.candidate_id not in stored]
    _adopt_references(pool, todo, gpu_type, frames)
    fresh: dict[str, Measurement] = {}
    buffer: list[Measurement] = []
    try:
        for m in (pool.measure(todo, gpu_type) if todo else ()):
            buffer.append(m)  # includes the reference a live harness measures first
            if m.candidate_id in wanted:
                fresh[m.candidate_id] = m
            if len(buffer) >= _FLUSH_EVERY:
                root.write_measurements(buffer)
                buffer = []
    finally:
        if buffer:
            root.write_measurements(buffer)
    missing = [ch.candidate_id for ch in todo if ch.candidate_id not in fresh]
    if missing:
        raise RuntimeError(f"the measurement backend returned no result for {len(missing)} candidates "
                           f"(first {missing[0]}); rerun to continue")
    return {**stored, **fresh}, len(stored)
