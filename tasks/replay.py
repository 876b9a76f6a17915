"""The replay generator: a measured corpus answers for the model (``--generator replay``).

A corpus (``benchmarks/llm_corpus.py``; ``data/pools/llm`` is the packaged one) records which
kernels a model wrote for which parent. Its recorded tree, per operation:

    the op's eager reference
      -> the corpus's roots: the template variants that were given to the model as parents
         -> the children the model wrote for each
            -> their children, where a later round recorded some

``ReplayModel`` is a ``kernelcast.tasks.generators.Model``: asked for a child of a parent, it answers with
the parent's next recorded child, in an order fixed by the run's seed. Its answers go through
the free-form generator's path (``ModelGenerator`` -> ``mixed_children``): parents chosen from
the archive, the same static checks (a recorded child today's checks refuse is dropped and
counted, as the model's answer would be), the same provenance rows. Measured by ``--backend
replay`` from the corpus's own measurements (failures replay their status), a search on a
machine without a GPU or a model walks the tree a live search would have met.

Each recorded child is given once per run, as a model's answer is: the k-th request for a child
of a parent gets the parent's k-th recorded child in an order fixed by the run's seed. A parent
with nothing recorded left (a child of the last recorded round) answers nothing: the replay's
tree ends where the corpus does.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from kernelcast.kernels.formats import submission_of
from kernelcast.kernels.ops import get_operation
from kernelcast.kernels.records import Candidate, Provenance
from kernelcast.kernels.screen import screen

# The corpus shipped with the project: children written by Qwen2.5-Coder-1.5B, measured on an H100.
PACKAGED_CORPUS = str(Path(__file__).resolve().parents[1] / "data" / "pools" / "llm")


@dataclass(frozen=True)
class RecordedTree:
    """One operation's recorded tree: each parent's children in the order they were written."""

    op: str
    reference_id: str
    children: Mapping[str, tuple[Candidate, ...]]  # parent id -> its recorded children
    provenance: Mapping[str, Provenance]  # child id -> how the model wrote it

    @property
    def roots(self) -> tuple[Candidate, ...]:
        return self.children.get(self.reference_id, ())

    def nodes(self) -> list[Candidate]:
        """Every candidate of the tree but the reference, parents before their children."""
        out, queue = [], list(self.roots)
        while queue:
            c = queue.pop(0)
            out.append(c)
            queue += self.children.get(c.candidate_id, ())
        return out


def read_tree(corpus: str, op: str) -> RecordedTree:
    """The recorded tree of ``op`` in the corpus at ``corpus`` (a data root URI), or a ValueError naming what is missing."""
    from kernelcast.storage.dataset import DataRoot
    from kernelcast.storage.schema import candidates_from_frame, records_from_frame

    root = DataRoot(corpus)
    frame = root.read_candidates(op=op)
    if frame.empty:
        every = root.read_candidates()
        held = ", ".join(sorted(every["op"].unique())) if not every.empty else "nothing"
        raise ValueError(f"the replay corpus {corpus} holds no {op} candidates; it holds: {held}")
    candidates = {c.candidate_id: c for c in candidates_from_frame(frame)}
    rows = root.read("provenance", op=op)
    provenance = {p.candidate_id: p for p in records_from_frame(Provenance, rows)} if not rows.empty else {}
    reference = get_operation(op).seed_candidates()[0].candidate_id
    by_parent: dict[str, list[Candidate]] = {}
    for c in candidates.values():
        if c.candidate_id == reference:
            continue
        parent = c.parent_id if c.parent_id in candidates else None
        by_parent.setdefault(parent or "", []).append(c)
    # The roots: kernels with no recorded parent that the model was asked to rewrite.
    roots = [c for c in by_parent.pop("", []) if c.candidate_id in by_parent]
    children = {reference: roots, **by_parent}

    def written(c: Candidate):  # the order the model wrote them: round, then request seed
        p = provenance.get(c.candidate_id)
        return (p.generation, p.seed, c.candidate_id) if p else (0, 0, c.candidate_id)

    return RecordedTree(op, reference, {k: tuple(sorted(v, key=written)) for k, v in children.items()}, provenance)


class ReplayModel:
    """Answers the k-th request of a run for a child of a parent with that parent's k-th recorded child
    (``kernelcast.tasks.generators.Model``)."""

    # A resumed run makes its finished generations again, in order, from the same archive: the
    # requests, and so the answers, are the interrupted run's.
    repeatable = True

    def __init__(self, corpus: str, op: str, seed: int = 0):
        self.corpus = corpus
        self.op = op
        self.seed = seed
        self.tree: RecordedTree | None = None
        self.answered: Counter = Counter()  # parent id -> its recorded children given so far in this run
        self.last_counts_ = None
        self.provenance_: dict[str, Provenance] = {}

    def probe(self) -> None:
        """Read the op's tree; a corpus without the op, or whose op has no parents, fails here."""
        self.tree = read_tree(self.corpus, self.op)
        if not self.tree.roots:
            raise ValueError(f"the replay corpus {self.corpus} records no children of any {self.op} kernel")

    def source_mode(self, space) -> bool:
        return True  # a recorded child is a whole source, as a free-form rewrite is

    def exhausted(self, parent_ids: Sequence[str]) -> bool:
        if self.tree is None:
            self.probe()
        return all(self.answered[p] >= len(self.tree.children.get(p, ()))
                   for p in (parent_ids or [self.tree.reference_id]))

    def order(self, parent_id: str) -> list[Candidate]:
        """The parent's recorded children in the order this run gets them: a shuffle fixed by (seed, parent)."""
        kids = self.tree.children.get(parent_id, ())
        return sorted(kids, key=lambda c: hashlib.blake2b(f"{self.seed}:{parent_id}:{c.candidate_id}".encode(),
                                                          digest_size=8).digest())

    def propose(self, op_name: str, parents: Sequence, space=None, measured: Sequence = (), seed: int = 0,
                seen: set[str] | None = None, temperature: float | None = None, run_id: str = "",
                generation: int = 0) -> list[Candidate]:
        """One recorded child per parent (a ``kernelcast.tasks.llm_generator.Parent``; no kernel: the reference) with one left.

        Each answer passes the static checks a model's answer passes (``seen``: the fingerprints of
        the kernels the run knows; a copy of one is a duplicate), and each drop is counted by reason.
        A parent whose recorded children are all given answers nothing, and is not counted as asked.
        """
        from kernelcast.tasks.llm_generator import GeneratorCounts

        if self.tree is None:
            self.probe()
        if op_name != self.op:
            raise ValueError(f"this replay model answers for {self.op}, not {op_name}")
        op = get_operation(op_name)
        seen = set() if seen is None else seen
        self.last_counts_ = counts = GeneratorCounts()
        self.provenance_ = {}
        children = []
        for parent in parents:
            pid = parent.candidate.candidate_id if parent.candidate is not None else self.tree.reference_id
            recorded = self.order(pid)
            if self.answered[pid] >= len(recorded):
                continue
            child = recorded[self.answered[pid]]
            self.answered[pid] += 1
            counts.asked += 1
            reason, _ = screen(op, child, submission_of(child.source), seen)
            if reason:
                counts.screened[reason] += 1
                continue
            counts.children += 1
            children.append(child)
            self.provenance_[child.candidate_id] = self._provenance(child, run_id, generation)
        return children

    def _provenance(self, child: Candidate, run_id: str, generation: int) -> Provenance:
        """The recorded provenance, as this run's: who wrote the child, and that this run replayed it."""
        recorded = self.tree.provenance.get(child.candidate_id)
        if recorded is None:  # a root: a template variant the corpus gave the model, written by nobody
            recorded = Provenance(run_id, child.candidate_id, child.op, child.parent_id, child.origin, model="",
                                  model_sha256="", prompt_version="", temperature=0.0, seed=0, generation=0,
                                  answer_chars=0, seconds=0.0)
        return dataclasses.replace(recorded, run_id=run_id, generation=generation,
                                   generator=f"replay:{recorded.generator}")

