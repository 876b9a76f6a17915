"""Build what a search runs on from its validated config: data root, measurement pool, surrogate, tracking.

Every service is reached here, before the first generation, so an unreachable S3 endpoint
or MLflow server, a GPU type nobody can measure, or a replay pool without the operation
fails with a clear error before any GPU time is spent.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import posixpath

from threadpoolctl import threadpool_limits

from kernelcast.storage.dataset import DataRoot, RetryPolicy
from kernelcast.storage.tracking import Tracker, default_tracking_uri
from kernelcast.tasks.generators import base_generator
from kernelcast.tasks.context import SearchContext
from kernelcast.tasks.config import (NO_SURROGATE, PACKAGED_POOL, ConfigError, SearchConfig, check_gpu_type, check_roots,
                                     default_run_id, validate)

MODEL_FOLDER = "models"  # fitted surrogate priors under the data root, reused across runs


def data_root(config: SearchConfig) -> DataRoot:
    root = DataRoot(config.data, storage_options=dict(config.storage_options),
                    retry=RetryPolicy(budget_s=config.storage_retry_s))
    root.probe()
    return root


def resolve(config: SearchConfig) -> SearchConfig:
    """Validate once, then settle backend 'auto' and GPU type 'auto' against what this machine has.

    The one full validation (every setting, then the operation) runs on the config as given, so a bad
    setting fails before torch loads or a pool is read."""
    return settle(validate(config))


def settle(config: SearchConfig) -> SearchConfig:
    """A validated config with backend 'auto' and GPU type 'auto' settled against what this machine has; what
    settling decides is checked on its own (a GPU type this project knows, ``generator_roots`` on that GPU
    type), not by validating the whole config again."""
    if base_generator(config.generator) == "replay" and config.replay_pool == PACKAGED_POOL:
        config = config.replace(replay_pool=config.replay_corpus)  # replayed children replay their own measurements
    if "auto" not in (config.backend, config.gpu_type):
        return config
    backend = config.backend
    if backend == "auto":
        import torch

        backend = "local" if torch.cuda.is_available() else "replay"
    gpu_type, settle_gpu = config.gpu_type, config.gpu_type == "auto"
    if settle_gpu:
        if backend == "local":
            from kernelcast.kernels.hardware import detect

            gpu_type = detect().gpu_type
        else:  # replay (validate refuses backend ray without an explicit gpu_type: the cluster may hold several)
            from kernelcast.infra.measure import ReplayMeasurer

            available = ReplayMeasurer(config.replay_pool, "").available_gpu_types()
            if not available:
                raise ConfigError(f"the replay pool {config.replay_pool} holds no measurements")
            gpu_type = "h100" if "h100" in available else available[0]
    config = config.replace(backend=backend, gpu_type=gpu_type)
    if settle_gpu:  # what validate could not check while the GPU type was 'auto'
        check_gpu_type(gpu_type)
        config = config if config.run_id else config.replace(run_id=default_run_id(config))
        check_roots(config)  # generator_roots: the pool's kernels on the settled GPU type
    return config


def open_context(config: SearchConfig) -> SearchContext:
    """A search's context from a raw config: validated once (``resolve``), its data root opened and probed once."""
    config = resolve(config)
    return SearchContext(config, data_root(config))


def measure_pool(config: SearchConfig):
    """The pool that measures ``config.gpu_type``: this GPU, the replay pool, or a Ray cluster."""
    from kernelcast.infra.measure import LocalMeasurePool, LocalMeasurer, ReplayMeasurer
    from kernelcast.kernels.hardware import INTERPRETER

    if config.backend == "replay":
        measurer = ReplayMeasurer(config.replay_pool, config.gpu_type)
        if config.gpu_type not in measurer.available_gpu_types():
            raise ConfigError(f"the replay pool {config.replay_pool} has no measurements on {config.gpu_type}; "
                              f"it has: {', '.join(measurer.available_gpu_types()) or 'none'}")
        return LocalMeasurePool([measurer])
    if config.backend == "local" and config.gpu_type == INTERPRETER:  # correctness on the CPU, no timings
        return LocalMeasurePool([LocalMeasurer(mode=INTERPRETER, precision=config.precision)])
    if config.backend == "local":
        measurer = LocalMeasurer(precision=config.precision)
        if measurer.gpu_type != config.gpu_type:
            measurer.close()
            raise ConfigError(f"this machine's GPU is {measurer.gpu_type}, not {config.gpu_type}; measure "
                              f"{config.gpu_type} on a Ray cluster that has it, or replay a measured pool")
        return LocalMeasurePool([measurer])
    from kernelcast.infra.ray_pools import RayMeasurePool

    # Nodes that declare GPUs measure for real; emulated types (no GPUs) answer from the replay pool.
    return RayMeasurePool.connect(config.ray_address or None, replay_pool=config.replay_pool,
                                  measurer_options={"precision": config.precision})


def _code_version() -> str:
    """The surrogate's own code: a pickled model is only reused by the code that fitted it."""
    import kernelcast.surrogate.features
    import kernelcast.surrogate.learned
    import kernelcast.surrogate.source

    return hashlib.sha256(b"".join(open(m.__file__, "rb").read()
                                   for m in (kernelcast.surrogate.learned, kernelcast.surrogate.features, kernelcast.surrogate.source))).hexdigest()


def prior_corpus(config: SearchConfig) -> str:
    """The written corpus the prior's source model also learns from: the replay corpus of a replayed
    search, else ``prior_data``'s ``llm`` folder where one holds measurements; "" when there is none."""
    if base_generator(config.generator) == "replay":
        return config.replay_corpus
    corpus = posixpath.join(config.prior_data.rstrip("/"), "llm")
    return corpus if DataRoot(corpus).fingerprint("measurements") else ""


def _prior_key(config: SearchConfig, prior: DataRoot) -> str:
    corpus = prior_corpus(config)
    # The op is in the key whenever the prior leaves some of its rows out: the scope's, or a corpus's.
    op = config.op if config.prior_scope != "all" or corpus else ""
    h = hashlib.sha256()
    for part in (config.surrogate, _code_version(), prior.uri, config.gpu_type, config.prior_scope, op,
                 *sorted(prior.fingerprint("measurements")), corpus,
                 *(sorted(DataRoot(corpus).fingerprint("measurements")) if corpus else ())):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def model_path(config: SearchConfig) -> str:
    """Where, under a data root, the fitted prior of this config is kept."""
    return posixpath.join(MODEL_FOLDER, f"{config.surrogate}-{_prior_key(config, DataRoot(config.prior_data))}.pkl")


def prior_pairs(config: SearchConfig, pairs):
    """The rows of ``pairs`` the prior of ``config`` may be fit on (``prior_scope``).

    other-ops and all: the searched GPU type's rows when there are any (no cross-GPU shift, half
    the fitting time), every GPU type's otherwise; other-ops without the searched operation.
    other-gpus: every GPU type's rows but the searched operation's on the searched GPU type, and
    an error when no other GPU type has the operation measured, since the prior would then be
    other-ops under another name.
    """
    if pairs.empty:
        return pairs
    op, gpu = pairs["op"] == config.op, pairs["gpu_type"] == config.gpu_type
    if config.prior_scope == "other-gpus":
        if not (op & ~gpu).any():
            raise ConfigError(f"prior_scope other-gpus: {config.prior_data} has no measurements of {config.op} "
                              f"on a GPU type other than {config.gpu_type}")
        return pairs[~(op & gpu)]
    if gpu.any():
        pairs, op = pairs[gpu], op[gpu]
    return pairs if config.prior_scope == "all" else pairs[~op]


def prior_sources(config: SearchConfig):
    """The kernels, failed ones included, the prior's source model is fit on: the template pool's
    and the written corpus's (``prior_corpus``) on the searched GPU type, each against its anchor
    (``kernelcast.surrogate.dataset.source_pairs``); None when there are none.

    The searched operation's kernels are left out unless ``prior_scope`` is all, and its corpus
    kernels are left out even then when the search replays that corpus: the children it will
    forecast are those very kernels, and a forecast of a child from its own measurement says
    nothing of how the source model does on children it has not seen.
    """
    from kernelcast.surrogate.dataset import source_pairs

    corpus = prior_corpus(config)
    roots = [DataRoot(config.prior_data)] + ([DataRoot(corpus)] if corpus else [])
    rows = source_pairs(*roots, gpu_type=config.gpu_type)
    if rows.empty:
        return None
    if config.prior_scope != "all":
        rows = rows[rows["op"] != config.op]
    elif base_generator(config.generator) == "replay":
        rows = rows[(rows["op"] != config.op) | (rows["origin"] == "template")]
    return rows if not rows.empty else None


def fit_prior(config: SearchConfig, root: DataRoot):
    """The learned (or source) surrogate fit on the prior data (as much of it as ``prior_scope``
    allows) and, for its source model, the written corpus (``prior_sources``); cached under the root."""
    from kernelcast.surrogate.dataset import case_pairs, loadable_rows
    from kernelcast.surrogate.registry import fit_prior as fit, get_forecaster_factory

    prior = DataRoot(config.prior_data)
    path = model_path(config)
    stored = root.get_object(path)
    if stored is not None:
        return pickle.loads(stored)
    pairs = loadable_rows(prior_pairs(config, case_pairs(prior)))
    if pairs.empty:
        raise ConfigError(f"no measured pairs under {config.prior_data} to fit the {config.surrogate} surrogate on")
    sources = prior_sources(config)
    # One OpenMP thread: gradient boosting's thread pool spins for its share of cores, and on a
    # busy machine (pytest, a Ray worker, a GPU harness compiling) that made fitting 20x slower.
    with threadpool_limits(limits=1, user_api="openmp"):
        forecaster = get_forecaster_factory(config.surrogate)()
        if config.prior_scope == "other-gpus" and hasattr(forecaster, "held_out"):
            forecaster.held_out = "gpu_type"  # its spread: the error of porting an op, not of a new op
        forecaster = fit(config.surrogate, forecaster, pairs, sources)
    buffer = io.BytesIO()
    pickle.dump(forecaster, buffer)
    root.put_object(path, buffer.getvalue())
    return forecaster


def grpo_pairs(prior_data: str, pairs_file: str = "", gpu_type: str | None = None, seed: int = 0):
    """The pairs an LLM surrogate trains on: a ``kernelcast pairs`` file, or pairs drawn from the
    ``gpu_type`` measurements under ``prior_data`` (the committed pool when empty)."""
    from kernelcast.surrogate.pairs import PairSettings, build_pairs, read_pairs

    if pairs_file:
        return read_pairs(pairs_file)
    return build_pairs(DataRoot(prior_data or PACKAGED_POOL), PairSettings(gpu_type=gpu_type, seed=seed))


def grpo_tracker(settings):
    """What makes the MLflow experiment a GRPO run (``kernelcast.surrogate.grpo.GRPOSettings``) logs to, for
    ``train_grpo``'s ``make_tracker``; None without a tracking URI."""
    if not settings.tracking_uri:
        return None
    return functools.partial(Tracker, settings.tracking_uri, settings.experiment)


def forecaster(config: SearchConfig, root: DataRoot):
    """The surrogate a search forecasts with; None for the equal-budget baseline."""
    if config.surrogate == NO_SURROGATE:
        return None
    if config.surrogate == "llm":
        if config.backend == "ray":
            from kernelcast.infra.ray_pools import ForecasterPool

            return ForecasterPool.of_openai(config.llm_url, config.llm_model)
        from kernelcast.surrogate.llm import OpenAIForecaster

        return OpenAIForecaster(config.llm_url, config.llm_model)
    from kernelcast.surrogate.registry import (fits_on_prior, get_forecaster_factory, load_trained, reads_folder,
                                    reads_measurements)

    if reads_folder(config.surrogate):
        wants = reads_measurements(config.surrogate) and config.surrogate_folder
        read = measurements_of(config.surrogate_folder) if wants else None
        return load_trained(config.surrogate, config.surrogate_folder, read)
    if fits_on_prior(config.surrogate):
        return fit_prior(config, root)
    return get_forecaster_factory(config.surrogate)().fit(None)


def measurements_of(folder: str):
    """``read(op, gpu_type)``: the measurements of the data root ``folder`` (a hindsight surrogate's), in the order
    stored; a clear error where that root holds none."""
    root = DataRoot(folder)
    if not root.fs.exists(root.path + "/measurements"):
        raise ConfigError(f"surrogate_folder {folder} holds no measurements to forecast from")
    return lambda op, gpu_type: root.read_measurements(op=op, gpu_type=gpu_type)


def tracker(config: SearchConfig, root: DataRoot) -> Tracker:
    """The search's MLflow experiment, its artifacts under the data root ``root``."""
    t = Tracker(config.tracking_uri or default_tracking_uri(config.data), config.experiment, data=root)
    t.probe()
    return t


def open_search(config: "SearchConfig | SearchContext", track: bool = True):
    """A started ``Search`` (run registered, reference measured, tracking open) for a raw config, or for a
    context already opened (``open_context``), which is then neither validated nor opened again."""
    from kernelcast.tasks.search import Search

    context = config if isinstance(config, SearchContext) else open_context(config)
    t = tracker(context.config, context.root) if track else None
    pool = measure_pool(context.config)
    try:
        return Search.of(context, pool, forecaster(context.config, context.root), t).start()
    except BaseException:
        pool.close()
        raise
