"""A code language model's reading of a kernel, as features of a gradient-boosted forecaster.

``embed_pairs`` reads each (anchor, candidate) source pair with a causal code model (the lmhead
forecaster's network with its LoRA adapter untrained, so the base model's own weights) and keeps the
pooled last hidden state (mean and last token). ``PairEmbeddings`` holds those vectors by the pair's
key and gives a forecaster a few columns of them: a principal-component projection fit on the
training pairs only, so a held-out problem's vectors never shape the projection it is read through.
``SourceForecaster(embeddings=...)`` appends the columns to its source features (and the learned
forecaster's source part, through ``source_options``). A pair without a vector gets NaN columns (the
boosters read them as absent).

The vectors are made once, on a GPU (``benchmarks/cudal1_embed.py``), and stored as a Parquet
table: ``key`` (``pair_key``), ``op``, ``candidate_id``, ``vector``.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import pandas as pd

from kernelcast.surrogate.forecast import ForecastRequest

COLUMNS = ("key", "op", "candidate_id", "vector")


def pair_key(anchor_source: str, candidate_source: str) -> str:
    """The key of one (anchor, candidate) source pair: what the vector was read from, nothing else."""
    h = hashlib.sha1()
    for text in (anchor_source, candidate_source):
        data = text.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


class PairEmbeddings:
    """Stored pair vectors, reduced to ``dims`` principal components of the pairs a forecaster fits on."""

    def __init__(self, vectors: dict[str, np.ndarray], dims: int = 16, source: str = ""):
        if dims < 1:
            raise ValueError(f"dims must be at least 1, got {dims}")
        widths = {len(v) for v in vectors.values()}
        if len(widths) > 1:
            raise ValueError(f"the stored vectors differ in width: {sorted(widths)}")
        self.vectors = vectors
        self.dims = dims
        self.source = source  # where the vectors were read from (a file), for the forecaster's version

    @classmethod
    def read(cls, path: str, dims: int = 16) -> "PairEmbeddings":
        table = pd.read_parquet(path)
        missing = [c for c in ("key", "vector") if c not in table.columns]
        if missing:
            raise ValueError(f"{path} is no embeddings table: it lacks {', '.join(missing)} "
                             f"(benchmarks/cudal1_embed.py writes one)")
        if table.empty:
            raise ValueError(f"{path} holds no vectors")
        return cls({k: np.asarray(v, dtype=float) for k, v in zip(table["key"], table["vector"])}, dims, path)

    @property
    def version(self) -> str:
        return f"emb{self.dims}"

    def lookup(self, requests: Sequence[ForecastRequest]) -> tuple[np.ndarray, np.ndarray]:
        """(vectors of the requests found, which requests were found)."""
        keys = [pair_key(r.anchor.source, r.candidate.source) for r in requests]
        found = np.array([k in self.vectors for k in keys], dtype=bool)
        width = len(next(iter(self.vectors.values()))) if self.vectors else 0
        rows = [self.vectors[k] for k, ok in zip(keys, found) if ok]
        return (np.vstack(rows) if rows else np.empty((0, width))), found

    def fit(self, requests: Sequence[ForecastRequest]) -> "FittedEmbeddings":
        """The projection fit on these (training) requests' vectors: their mean and top principal axes."""
        X, _ = self.lookup(requests)
        if len(X) < 2:
            raise ValueError(f"the embeddings hold vectors for {len(X)} of the {len(requests)} training kernels: "
                             f"a projection needs two or more (were they read from this pool?)")
        mean = X.mean(axis=0)
        # principal axes by SVD of the centred vectors; at most as many as the data allow
        _, _, vt = np.linalg.svd(X - mean, full_matrices=False)
        return FittedEmbeddings(self, mean, vt[: min(self.dims, len(vt))])


class FittedEmbeddings:
    """``PairEmbeddings`` with its projection fit: ``matrix`` gives each request's ``dims`` columns."""

    def __init__(self, table: PairEmbeddings, mean: np.ndarray, axes: np.ndarray):
        self.table, self.mean, self.axes = table, mean, axes

    def matrix(self, requests: Sequence[ForecastRequest]) -> np.ndarray:
        """(n, dims): the requests' vectors projected; NaN for a pair without a vector (and for the columns
        past the axes the training data allowed)."""
        out = np.full((len(requests), self.table.dims), np.nan)
        X, found = self.table.lookup(requests)
        if len(X):
            out[np.flatnonzero(found), : len(self.axes)] = (X - self.mean) @ self.axes.T
        return out


def embed_pairs(pairs: Sequence[tuple[str, str]], model: str, max_tokens: int = 2048, device: str = "",
                batch_size: int = 8, precision: str = "bf16") -> np.ndarray:
    """(n, 2 * hidden) pooled vectors of the (anchor, candidate) pairs, read by ``model`` (a local GGUF file or
    model folder) with an untrained adapter: the base model's reading."""
    from kernelcast.surrogate.lmhead.model import HeadConfig, PairModel

    net = PairModel(HeadConfig(model=model, max_tokens=max_tokens, precision=precision), device)
    return net.embed(list(pairs), batch_size)


def write_table(path: str, ops: Sequence[str], candidate_ids: Sequence[str], pairs: Sequence[tuple[str, str]],
                vectors: np.ndarray) -> int:
    """Store the vectors by pair key (one row per distinct pair); the number of rows written."""
    table = pd.DataFrame({"key": [pair_key(a, c) for a, c in pairs], "op": list(ops),
                          "candidate_id": list(candidate_ids), "vector": [np.asarray(v, dtype=np.float32)
                                                                          for v in vectors]})
    table = table.drop_duplicates("key")
    table.to_parquet(path, index=False)
    return len(table)
