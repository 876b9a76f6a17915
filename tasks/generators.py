"""Generators: where a generation's children come from, behind one small protocol and one registry.

A search names its generator (``SearchConfig.generator``); ``make_generator`` builds it and
the search's generate step calls ``children`` once per generation, whichever it is:

- ``template``: mutations, crossovers and fresh draws from the op's template space;
- ``llm``: a model picks template variants (``tasks/llm_generator.py``); template children fill up;
- ``freeform``: a model rewrites parents' whole sources;
- ``replay``: a measured corpus answers for the model (``tasks/replay.py``): a parent's children
  are the ones a model wrote for it when the corpus was made, so a search without a model or a
  GPU walks the corpus's recorded tree;
- ``variants``: execution variants (``kernelcast.kernels.variants``: torch.compile, CUDA graphs, channels_last,
  cuDNN autotuning) of the reference and of the archive's measured parents, for KernelBench tasks;
  ``<model generator>+variants`` (``freeform+variants``) composes it with a model's rewrites, so the
  model's measured children get variants too.

The three model generators share one path, ``ModelGenerator``: parents chosen from the archive,
one request per parent, the same static checks, counts and provenance rows. Only the model differs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from kernelcast.kernels.records import Candidate, Provenance


@dataclass(frozen=True)
class Offspring:
    """What one generation's generate step produced."""

    children: list[Candidate]
    counts: object = None  # kernelcast.tasks.llm_generator.GeneratorCounts of a model's answers; None: no model asked
    provenance: list[Provenance] = field(default_factory=list)  # who wrote each child (model generators)
    skipped: list = field(default_factory=list)  # kernelcast.kernels.variants.Skipped: variants that could not apply, and why


class Generator(Protocol):
    """Children of the archive's parents, one generation at a time."""

    name: str
    # True: the same archive, seed and generation give the same children, so a resumed run makes
    # them again; False (a sampled model): a resumed run takes what the journal recorded instead.
    repeatable: bool

    def probe(self) -> None:
        """Reach whatever the generator needs (a model endpoint, a corpus); fail before any GPU time."""

    def children(self, op: str, space, archive, n: int, rng: random.Random, explore: float, *,
                 seed: int, run_id: str, generation: int) -> Offspring:
        """Up to ``n`` new children of the archive's parents (and fresh ones, where the generator makes them)."""

    def exhausted(self, space, archive) -> bool:
        """Whether no generation could bring a new child any more (the search then stops: 'no candidates')."""


class Model(Protocol):
    """What writes children for ``ModelGenerator``: one answer per parent (``kernelcast.tasks.llm_generator.LLMGenerator``
    asks a model; ``kernelcast.tasks.replay.ReplayModel`` replays what a model wrote)."""

    repeatable: bool
    last_counts_: object  # GeneratorCounts of the last ``propose``
    provenance_: dict[str, Provenance]  # candidate id -> who wrote it, for the last ``propose``

    def probe(self) -> None: ...

    def source_mode(self, space) -> bool: ...

    def exhausted(self, parent_ids: Sequence[str]) -> bool:
        """Whether none of these parents (ids; none: the op's own kernels, which parent a search until one
        of its children runs) can get a child any more."""

    def propose(self, op_name: str, parents: Sequence, space=None, measured: Sequence = (), seed: int = 0,
                seen: set[str] | None = None, temperature: float | None = None, run_id: str = "",
                generation: int = 0) -> list[Candidate]: ...


class TemplateGenerator:
    """Children bred from the op's template space: no model, no answers to count."""

    name = "template"
    repeatable = True

    def probe(self) -> None:
        pass

    def children(self, op, space, archive, n, rng, explore, *, seed, run_id, generation) -> Offspring:
        from kernelcast.tasks.state import breed

        return Offspring(breed(space, archive, n, rng, explore, exclude=set()))

    def exhausted(self, space, archive) -> bool:
        return len(archive) >= len(space.variants())


class ModelGenerator:
    """Children a ``Model`` writes for parents chosen from the archive, ``per_generation`` requests a generation.

    ``roots``: kernels given as the first children, before the model is asked for any (``template_roots``):
    a free-form search then rewrites measured template kernels, as the corpus's model did, rather
    than the op's eager reference."""

    def __init__(self, name: str, model: Model, per_generation: int, roots: Sequence[Candidate] = ()):
        self.name = name
        self.model = model
        self.per_generation = per_generation
        self.repeatable = model.repeatable
        self.roots = tuple(roots)

    def probe(self) -> None:
        self.model.probe()

    def children(self, op, space, archive, n, rng, explore, *, seed, run_id, generation) -> Offspring:
        from kernelcast.tasks.llm_generator import mixed_children

        pending = [c for c in self.roots if c.candidate_id not in archive.entries]
        if pending:  # the roots first, alone: the model rewrites them once they are in the archive
            return Offspring(pending[:n])
        kids = mixed_children(self.model, op, space, archive, n, min(n, self.per_generation), rng, explore,
                              seed=seed * 1000 + generation, run_id=run_id, generation=generation)
        ids = {ch.candidate_id for ch in kids}
        return Offspring(kids, self.model.last_counts_,
                         [p for cid, p in self.model.provenance_.items() if cid in ids])

    def exhausted(self, space, archive) -> bool:
        if any(c.candidate_id not in archive.entries for c in self.roots):
            return False
        if space is not None and not self.model.source_mode(space):
            return len(archive) >= len(space.variants())  # the model picks variants of the space, as breeding does
        # Parents from the archive while one can get a child; then the op's own kernels again.
        return self.model.exhausted([e.candidate.candidate_id for e in archive.parents()]) and self.model.exhausted([])


class VariantGenerator:
    """Execution variants of the op's reference and of the archive's parents (best first), behind an optional
    base generator: the base's children first, the variants fill up; at least half of ``n`` is left to them
    while they have children to give. Repeatable: a parent's variants are the same every time.

    ``roots`` (alone, with no base): kernels given as the first children, as a free-form search's are (a
    measured pool's kernels of the task, ``template_roots``); their variants follow once they are measured.

    A child offered in an earlier generation and not measured since (the search passed on it) gets its own
    variants offered too, after those of the measured parents: a variant may pay where its parent does not (on
    KernelBench level2/17, a CUDA graph of a cuDNN-autotuned kernel of 1.1x ran at 2.57x), and a search that must
    measure a parent to see its variants never meets that one when it is sure the parent is no better."""

    def __init__(self, op: str, base: Generator | None = None, roots: Sequence[Candidate] = (),
                 recorded: dict[str, list[Candidate]] | None = None):
        if base is not None and roots:
            raise ValueError("a composed generator's roots belong to its base generator")
        self.op = op
        self.base = base
        self.roots = tuple(roots)
        self.recorded = recorded  # parent id -> the variant children a live search made of it (replayed searches)
        self.name = f"{base.name}+variants" if base else "variants"
        self.repeatable = base.repeatable if base else True
        self.offered: dict[str, Candidate] = {}  # every variant child given so far, in the order given

    def passed(self, archive) -> list[Candidate]:
        """The variant children given in an earlier generation that the archive still lacks."""
        return [c for i, c in self.offered.items() if i not in archive.entries]

    def probe(self) -> None:
        if self.base is not None:
            self.base.probe()

    def _variants(self, op: str, archive, rng: random.Random | None = None,
                  passed: Sequence[Candidate] = ()) -> tuple[list[Candidate], list]:
        """Every variant not yet in the archive, parent by parent (best measured first), then those of the
        ``passed`` children; with ``rng``, each parent's own in an order drawn from it, so that a search that
        measures the first few (the equal-budget baseline) picks among them at random rather than always in the
        order the variants are listed."""
        from kernelcast.kernels.ops import get_operation
        from kernelcast.kernels.variants import variant_children

        operation = get_operation(op)
        reference = operation.seed_candidates()[0]
        ranked = sorted(archive.parents(), key=lambda e: -e.value)
        parents = [e.candidate for e in ranked if e.value >= 0.0] + [reference] + \
                  [e.candidate for e in ranked if e.value < 0.0]  # value: log speedup
        kids, skipped, seen = [], [], set(archive.entries)
        for parent in {p.candidate_id: p for p in [*parents, *passed]}.values():
            if self.recorded is not None:
                made, why = list(self.recorded.get(parent.candidate_id, ())), []
            else:
                made, why = variant_children(operation, parent)
            if rng is not None:
                rng.shuffle(made)
            kids += [k for k in made if k.candidate_id not in seen]
            seen.update(k.candidate_id for k in made)
            skipped += why
        return kids, skipped

    def children(self, op, space, archive, n, rng, explore, *, seed, run_id, generation) -> Offspring:
        pending = [c for c in self.roots if c.candidate_id not in archive.entries]
        variants, skipped = self._variants(op, archive, rng, self.passed(archive))
        if pending:  # the roots first, beside the reference's own variants: theirs follow once they are measured
            return self._give(Offspring((pending + variants)[:n], skipped=skipped))
        if self.base is None:
            return self._give(Offspring(variants[:n], skipped=skipped))
        made = self.base.children(op, space, archive, n - min(len(variants), n // 2), rng, explore, seed=seed,
                                  run_id=run_id, generation=generation)
        ids = {c.candidate_id for c in made.children}
        extra = [v for v in variants if v.candidate_id not in ids][: n - len(made.children)]
        return self._give(Offspring(made.children + extra, made.counts, made.provenance, skipped))

    def _give(self, made: Offspring) -> Offspring:
        from kernelcast.kernels.variants import ORIGIN_PREFIX

        roots = {c.candidate_id for c in self.roots}
        self.offered.update((c.candidate_id, c) for c in made.children
                            if c.origin.startswith(f"{ORIGIN_PREFIX}:") and c.candidate_id not in roots)
        return made

    def exhausted(self, space, archive) -> bool:
        if any(c.candidate_id not in archive.entries for c in self.roots):
            return False
        return not self._variants(self.op, archive, passed=self.passed(archive))[0] and \
            (self.base is None or self.base.exhausted(space, archive))


def _template(config) -> Generator:
    return TemplateGenerator()


def _llm_model(config, mode: str):
    from kernelcast.tasks.llm_generator import LLMGenerator

    return LLMGenerator(config.generator_url, config.generator_model, mode=mode,
                        temperature=config.generator_temperature, schema_style=config.generator_schema_style,
                        model_sha256=config.generator_model_sha256, max_tokens_source=config.generator_max_tokens,
                        concurrency=config.generator_concurrency)


def _llm(config) -> Generator:
    return ModelGenerator("llm", _llm_model(config, "variant"), config.generator_children)


def _roots(config) -> list[Candidate]:
    """The kernels ``config.generator_roots`` starts a search from (none without it)."""
    return [c for c, _ in template_roots(config.generator_roots, config.op, config.gpu_type)] \
        if config.generator_roots else []


def rewriter(config):
    """The model that writes a free-form search's children (whole rewritten sources), from ``config``'s settings."""
    return _llm_model(config, "source")


def _freeform(config) -> Generator:
    return ModelGenerator("freeform", rewriter(config), config.generator_children, _roots(config))


def template_roots(pool: str, op: str, gpu_type: str | None = None,
                   fallback: bool = True) -> list[tuple[Candidate, float]]:
    """(candidate, speedup) of ``op``'s best, median and poor (10th percentile) kernel measured in the data
    root ``pool``, ranked by their speedups on ``gpu_type``: its template variants, and for an imported
    task the kernels imported with it (CUDA-L1's, in data/pools/cudal1), never its reference nor the null
    resubmission of it. Where the pool measured none of them there (or ``gpu_type`` is None or 'auto'), on
    the GPU type it measured most of them on, or a ValueError without ``fallback``. These were the corpus's
    parents (``benchmarks/llm_corpus.py``), and are a live free-form search's roots."""
    from kernelcast.kernels.null import NULL_MARK
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import candidates_from_frame

    root = DataRoot(pool)
    c = root.read_candidates(op=op)
    m = root.read_measurements(op=op)
    if not c.empty:
        c = c[c["origin"].isin(ROOT_ORIGINS) & ~c["source"].str.contains(NULL_MARK, regex=False)]
    if not m.empty and not c.empty:
        m = m[(m["status"] == "ok") & m["candidate_id"].isin(c["candidate_id"])]
    if m.empty or c.empty:
        raise ValueError(f"the pool {pool} has no measured {op} template variants or imported kernels to start from")
    if gpu_type not in set(m["gpu_type"]):
        if not fallback:
            raise ValueError(f"the pool {pool} has no measured {op} template variants or imported kernels on {gpu_type}")
        gpu_type = m["gpu_type"].value_counts().sort_index().idxmax()
    m = m[m["gpu_type"] == gpu_type].drop_duplicates("candidate_id", keep="last")
    m = m.sort_values(["speedup", "candidate_id"]).reset_index(drop=True)
    picks = [m.loc[i] for i in sorted({len(m) - 1, len(m) // 2, int(0.1 * (len(m) - 1))}, reverse=True)]
    by_id = {x.candidate_id: x for x in candidates_from_frame(c[c["candidate_id"].isin([r.candidate_id
                                                                                       for r in picks])])}
    return [(by_id[r.candidate_id], float(r.speedup)) for r in picks]


# A pool's kernels that can root a free-form search: template variants, and kernels imported with a task
# (the reference is the search's own seed, origin "seed"; a search's children have other origins).
ROOT_ORIGINS = ("template", "import")


def _replay(config) -> Generator:
    from kernelcast.tasks.replay import ReplayModel

    return ModelGenerator("replay", ReplayModel(config.replay_corpus, config.op, seed=config.seed),
                          config.generator_children)


def recorded_variants(pool: str, op: str) -> dict[str, list[Candidate]]:
    """The variant children of ``op`` recorded in the data root ``pool``, by parent id, in the order stored, and
    the model's rewrites recorded there beside them (origin ``llm``: a measured space's, ``headroom_search
    --space --live``), so that a replay of that space offers a parent's rewrites as it offers its variants."""
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import candidates_from_frame

    frame = DataRoot(pool).read_candidates(op=op)
    if frame.empty:
        return {}
    frame = frame[frame["origin"].str.startswith("variant:") | (frame["origin"] == "llm")]
    frame = frame.drop_duplicates("candidate_id")
    found: dict[str, list[Candidate]] = {}
    for c in candidates_from_frame(frame):
        found.setdefault(c.parent_id, []).append(c)
    return found


def _variants(config) -> Generator:
    recorded = recorded_variants(config.variants_recorded, config.op) if config.variants_recorded else None
    return VariantGenerator(config.op, roots=_roots(config), recorded=recorded)


GENERATORS: dict[str, Callable[[object], Generator]] = {
    "template": _template, "llm": _llm, "freeform": _freeform, "replay": _replay, "variants": _variants}
# Generators whose children may also get execution variants: "freeform+variants".
COMPOSABLE = ("llm", "freeform", "replay")
VARIANTS_SUFFIX = "+variants"


def base_generator(name: str) -> str:
    """The generator a name composes variants with ('freeform+variants' -> 'freeform'), or the name itself."""
    return name[: -len(VARIANTS_SUFFIX)] if name.endswith(VARIANTS_SUFFIX) else name


def generator_names() -> list[str]:
    """Every name ``make_generator`` accepts."""
    return [*GENERATORS, *(f"{g}{VARIANTS_SUFFIX}" for g in COMPOSABLE)]


def make_generator(config) -> Generator:
    """The generator ``config.generator`` names, built from the config's settings; a clear error for an unknown name."""
    if config.generator not in generator_names():
        raise ValueError(f"unknown generator {config.generator!r}; known: {', '.join(generator_names())}")
    base = GENERATORS[base_generator(config.generator)](config)
    return VariantGenerator(config.op, base) if config.generator != base_generator(config.generator) else base
