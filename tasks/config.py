"""One search, described by one validated configuration: from CLI flags or a YAML file, checked once at the edge.

Every check here runs before any GPU time is spent, and each error names the setting
that is wrong and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

from kernelcast.kernels.records import PRECISION_MODES  # standard library only

# The measured pool shipped with the project: the replay backend's answers and the learned prior's data.
PACKAGED_POOL = str(Path(__file__).resolve().parents[1] / "data" / "pools")

# The measured corpus of LLM-written children shipped with the project: the replay generator's answers.
PACKAGED_CORPUS = str(Path(PACKAGED_POOL) / "llm")

# Generators are named in tasks/generators.py (template, llm, freeform, replay, variants, and a model generator
# composed with variants: freeform+variants); these two ask a model, alone or composed.
LLM_GENERATORS = ("llm", "freeform")
POLICIES = ("budget", "conformal")
# What a search's budget counts: measurements charged, GPU-seconds charged, or GPU-seconds plus the seconds spent
# compiling (each measurement's gpu_seconds and compile_seconds: torch.compile and max-autotune are not free).
BUDGET_KINDS = ("measurements", "gpu_seconds", "gpu_compile_seconds")
# How unsure children are ranked for the budget (kernelcast.surrogate.online): a Thompson draw, expected improvement, or
# expected improvement per expected second (what a child of its origin has cost so far in this run).
ACQUISITIONS = ("thompson", "ei", "ei-per-second")
# What the learned prior may have seen of the searched operation: nothing (an honest forecast of
# a new operation), its measurements on other GPU types (porting a tuned operation to a new GPU
# type), or everything in prior_data.
PRIOR_SCOPES = ("other-ops", "other-gpus", "all")
BACKENDS = ("auto", "local", "replay", "ray")
NO_SURROGATE = "none"  # the equal-budget baseline: every child is measured
_RUN_ID_LENGTH = 64
_RUN_ID = re.compile(r"[a-z0-9][a-z0-9_.-]{0,%d}" % (_RUN_ID_LENGTH - 1))


class ConfigError(ValueError):
    """A search configuration that cannot run; the message names the setting."""


@dataclass(frozen=True)
class SearchConfig:
    op: str
    gpu_type: str = "auto"  # "auto": the local GPU's type, or h100 when replaying without a GPU
    budget: int | float = 32  # over the whole search, in budget_kind's units: measurements, or seconds
    budget_kind: str = "measurements"  # measurements | gpu_seconds | gpu_compile_seconds (BUDGET_KINDS)
    generations: int = 4
    children: int = 256  # per generation (forecasts are cheap); with surrogate "none", children = the budget
    generator: str = "template"  # template | llm | freeform | replay (tasks/generators.py)
    generator_url: str = ""  # generator "llm": an OpenAI-compatible endpoint
    generator_model: str = ""
    generator_children: int = 16  # model generators (llm, freeform, replay): requests per generation
    generator_schema_style: str = "json_schema"  # json_object: llama-cpp-python's server takes the schema there
    generator_temperature: float = 0.8
    generator_model_sha256: str = ""  # the model's weights hash, recorded with every child it writes
    generator_max_tokens: int = 2048  # generator freeform: most tokens of one rewritten source (its answer)
    generator_concurrency: int = 4  # model generators: requests in flight at once (a batching server takes many)
    # generator freeform: a measured pool (data root) whose best, median and poor template variants of the op
    # are the first generation's children and the model's first parents; "": the model rewrites the reference.
    generator_roots: str = ""
    # False: a search's roots are its starting point, measured first by every search (the baseline and the
    # surrogate's alike); True: the surrogate weighs them with the other children, as it would kernels a strong
    # generator wrote (the baseline still meets them first, in the generator's order).
    weigh_roots: bool = False
    replay_corpus: str = PACKAGED_CORPUS  # generator "replay": the corpus whose recorded children answer
    # generator variants: a data root whose recorded variant children (as a live variants search made them) are
    # offered rather than made anew, so a replay of that search meets the very children, and ids, it measured.
    variants_recorded: str = ""
    surrogate: str = "learned"  # learned | source | lmhead | roofline | random | llm | none
    surrogate_folder: str = ""  # a surrogate trained elsewhere (lmhead): the folder its training wrote
    policy: str = "budget"  # budget: trust a confidence threshold; conformal: a certified risk
    trust_threshold: float = 0.9  # max-probability at which a forecast is trusted (policy budget)
    target_risk: float = 0.05  # trusted-and-wrong-by-more-than-one-bin rate (policy conformal)
    acquisition: str = "thompson"  # thompson: a draw from each child's forecast; ei: expected improvement;
    # ei-per-second: expected improvement over the GPU (and compile) seconds a child of its origin costs
    explore: float = 0.2  # fraction of children drawn fresh from the space rather than bred from parents
    # tolerance: a correct kernel computed in a lower precision class than the reference's (fp16 for an fp32 task)
    # counts, flagged; strict: it counts as incorrect, whether measured now or reused (kernelcast.kernels.records.PRECISION_MODES)
    precision: str = "tolerance"
    # With budget_kind measurements: also stop once this much GPU time is charged (0: no limit), checked wave by wave.
    gpu_seconds_budget: float = 0.0
    measure_wave: int = 8  # with a budget in seconds: candidates measured between two checks of it
    seed: int = 0
    run_id: str = ""  # "": a new one from op, GPU type, surrogate, budget, seed and the time; rerun an id to resume
    data: str = "kernelcast-data"
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    storage_retry_s: float = 120.0  # how long a storage outage (S3 restarting) is retried before the search fails
    backend: str = "auto"  # auto: the local GPU if there is one, else replay from replay_pool
    replay_pool: str = PACKAGED_POOL  # with generator "replay", the corpus itself unless set otherwise
    prior_data: str = PACKAGED_POOL  # measurements the learned surrogate is first fit on
    prior_scope: str = "other-ops"  # other-ops | other-gpus | all: what the prior saw of the searched op
    tracking_uri: str = ""  # "" : sqlite under a local data root, else ./kernelcast-mlflow.db
    experiment: str = "kernelcast"
    llm_url: str = ""  # OpenAI-compatible endpoint for surrogate "llm"
    llm_model: str = ""
    ray_address: str = ""  # backend ray: "" starts a local Ray cluster

    @property
    def surrogate_on(self) -> bool:
        return self.surrogate != NO_SURROGATE

    def children_for(self, generation_budget: int) -> int:
        return self.children if self.surrogate_on else generation_budget

    @property
    def budget_in_seconds(self) -> bool:
        return self.budget_kind != "measurements"

    def charge(self, measurement) -> float:
        """What one measurement costs in the budget's units."""
        if self.budget_kind == "measurements":
            return 1.0
        return measurement.gpu_seconds + (measurement.compile_seconds if self.budget_kind == "gpu_compile_seconds"
                                          else 0.0)

    def generation_budgets(self) -> list[int]:
        """A measurements budget split over generations, the remainder to the earliest ones."""
        base, extra = divmod(self.budget, self.generations)
        return [base + (1 if g < extra else 0) for g in range(self.generations)]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)

    def replace(self, **changes: Any) -> "SearchConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "SearchConfig":
        """A config from a YAML/JSON mapping; unknown keys are an error, not silently ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown search settings {unknown}; known: {', '.join(sorted(known))}")
        if "op" not in values:
            raise ConfigError("a search needs an operation: set 'op'")
        return cls(**dict(values))


# Settings a run may be resumed under anew: where its data, tracking and endpoints are, not what it searches.
# Any other setting changed on a resume would make the journal's replay something other than the run it records.
RESUMABLE_CHANGES = frozenset({"run_id", "data", "storage_options", "storage_retry_s", "tracking_uri", "experiment",
                               "backend", "ray_address", "llm_url", "generator_url", "generator_concurrency"})


def changed_settings(stored_json: str, config: SearchConfig) -> list[str]:
    """The settings (other than ``RESUMABLE_CHANGES``) in which ``config`` differs from a run's stored config,
    as 'name: stored -> now'; a setting the stored config lacks (an older run) is taken at its default."""
    try:
        stored = json.loads(stored_json or "{}")
    except ValueError:
        return []
    now = json.loads(config.to_json())
    defaults = json.loads(SearchConfig(op=config.op).to_json())
    return [f"{k}: {stored.get(k, defaults.get(k))!r} -> {now[k]!r}" for k in sorted(now)
            if k not in RESUMABLE_CHANGES and stored.get(k, defaults.get(k)) != now[k]]


def default_run_id(config: SearchConfig) -> str:
    """A new id per start (a nightly schedule must not resume last night's run); pass it back to resume."""
    from datetime import datetime, timezone

    import hashlib

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dt%H%M%S")
    budget = f"{config.budget:.2f}s" if config.budget_in_seconds else f"{config.budget}"  # 27.51s, not 17 digits
    tail = f"-{config.gpu_type}-{config.surrogate}-b{budget}-s{config.seed}-{stamp}".replace("_", "-")
    op = config.op.replace("_", "-")
    room = _RUN_ID_LENGTH - len(tail)
    if len(op) > room:  # a long task name (an imported one): its head and a digest of the whole name
        op = f"{op[:room - 7].rstrip('-.')}-{hashlib.sha256(config.op.encode()).hexdigest()[:6]}"
    return op + tail


def _install_imported(config: SearchConfig) -> bool:
    """Install an imported task stored under the config's data root into this machine's tasks directory."""
    from kernelcast.kernels.formats import install_from_root
    from kernelcast.storage.dataset import DataRoot

    try:
        return install_from_root(DataRoot(config.data, storage_options=dict(config.storage_options)), config.op)
    except OSError:
        return False


def check_settings(config: SearchConfig) -> None:
    """A ConfigError naming the first bad setting, the operation aside.

    Nothing here loads the operation registry (torch) or reaches a service, so a bad flag
    fails at once; ``validate`` checks the operation after these.
    """
    from kernelcast.surrogate.registry import FACTORIES, reads_folder
    from kernelcast.tasks.generators import base_generator, generator_names

    check_gpu_type(config.gpu_type)
    if config.budget_kind not in BUDGET_KINDS:
        raise ConfigError(f"unknown budget_kind {config.budget_kind!r}; known: {', '.join(BUDGET_KINDS)}")
    if config.budget_in_seconds:
        if not (isinstance(config.budget, (int, float)) and not isinstance(config.budget, bool) and config.budget > 0):
            raise ConfigError(f"budget must be a positive number of seconds (budget_kind {config.budget_kind}), "
                              f"got {config.budget!r}")
        if config.gpu_seconds_budget:
            raise ConfigError(f"gpu_seconds_budget caps a measurements budget; with budget_kind "
                              f"{config.budget_kind} the budget itself is in seconds: leave it at 0")
    for name in (*(() if config.budget_in_seconds else ("budget",)), "generations", "children", "measure_wave", "generator_children", "generator_max_tokens",
                 "generator_concurrency"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive whole number, got {value!r}")
    if not config.budget_in_seconds and config.budget < config.generations:
        raise ConfigError(f"budget {config.budget} is less than one measurement per generation "
                          f"({config.generations} generations)")
    surrogates = (*FACTORIES, "llm", NO_SURROGATE)
    if config.surrogate not in surrogates:
        raise ConfigError(f"unknown surrogate {config.surrogate!r}; known: {', '.join(surrogates)}")
    for name, allowed in (("generator", generator_names()), ("policy", POLICIES), ("acquisition", ACQUISITIONS),
                          ("backend", BACKENDS), ("prior_scope", PRIOR_SCOPES), ("precision", PRECISION_MODES)):
        if getattr(config, name) not in allowed:
            raise ConfigError(f"unknown {name} {getattr(config, name)!r}; known: {', '.join(allowed)}")
    if config.backend == "ray" and config.gpu_type == "auto":
        raise ConfigError("backend ray needs an explicit gpu_type: the cluster may hold several")
    if base_generator(config.generator) in LLM_GENERATORS:
        if not (config.generator_url and config.generator_model):
            raise ConfigError(f"generator {config.generator!r} needs generator_url (an OpenAI-compatible endpoint) "
                              "and generator_model")
        if urlparse(config.generator_url).scheme not in ("http", "https"):
            raise ConfigError(f"malformed generator_url {config.generator_url!r}; expected http(s)://host[:port]/v1")
        if config.generator_schema_style not in ("json_schema", "json_object"):
            raise ConfigError(f"unknown generator_schema_style {config.generator_schema_style!r}; known: "
                              "json_schema, json_object")
        if not (isinstance(config.generator_temperature, (int, float)) and 0 <= config.generator_temperature <= 2):
            raise ConfigError(f"generator_temperature must lie in [0, 2], got {config.generator_temperature!r}")
        if config.generator_model_sha256 and not re.fullmatch(r"[0-9a-f]{64}", config.generator_model_sha256):
            raise ConfigError(f"generator_model_sha256 must be 64 lowercase hex digits, got "
                              f"{config.generator_model_sha256!r}")
    if base_generator(config.generator) == "replay" and not config.replay_corpus:
        raise ConfigError("generator 'replay' needs replay_corpus (a measured corpus, e.g. data/pools/llm)")
    if config.surrogate in FACTORIES and reads_folder(config.surrogate) and not config.surrogate_folder:
        raise ConfigError(f"surrogate {config.surrogate!r} needs surrogate_folder: the folder it was trained into")
    if config.surrogate == "llm" and not (config.llm_url and config.llm_model):
        raise ConfigError("surrogate 'llm' needs llm_url (an OpenAI-compatible endpoint) and llm_model")
    if not 0 < config.trust_threshold <= 1:
        raise ConfigError(f"trust_threshold must lie in (0, 1], got {config.trust_threshold}")
    if not 0 < config.target_risk < 1:
        raise ConfigError(f"target_risk must lie in (0, 1), got {config.target_risk}")
    if not 0 <= config.explore <= 1:
        raise ConfigError(f"explore must lie in [0, 1], got {config.explore}")
    if not (isinstance(config.storage_retry_s, (int, float)) and config.storage_retry_s >= 0):
        raise ConfigError(f"storage_retry_s must be zero (no retries) or more seconds, got {config.storage_retry_s!r}")
    if config.gpu_seconds_budget < 0:
        raise ConfigError(f"gpu_seconds_budget must be zero (no limit) or positive, got {config.gpu_seconds_budget}")
    if config.run_id and not _RUN_ID.fullmatch(config.run_id):
        raise ConfigError(f"bad run id {config.run_id!r}: use up to 64 lowercase letters, digits, '_', '-', '.'")


def check_operation(config: SearchConfig) -> None:
    """A ConfigError unless the operation is built in, imported here, or an imported task under the data root
    (installed from there), and the generator can search it."""
    from kernelcast.kernels.formats import is_imported_name
    from kernelcast.kernels.ops import get_operation

    try:
        get_operation(config.op)
    except ValueError as exc:
        if not (is_imported_name(config.op) and _install_imported(config)):
            raise ConfigError(str(exc)) from None
    if config.generator == "template" and is_imported_name(config.op):
        raise ConfigError(f"operation {config.op} is an imported task with no template space; search it with "
                          "generator 'freeform' or 'llm' (generator_url, generator_model), or 'variants'")
    if config.generator.endswith("variants"):
        from kernelcast.kernels.ops import get_operation

        if getattr(get_operation(config.op), "format", "") not in ("kernelbench", "gpumode"):
            raise ConfigError(f"generator {config.generator!r} runs a KernelBench ModelNew or a GPU MODE "
                              f"custom_kernel another way; {config.op} is not an imported KernelBench or GPU MODE "
                              "task (kb.<name>, gpumode.<name>)")
    if config.variants_recorded:
        if not config.generator.endswith("variants"):
            raise ConfigError(f"variants_recorded gives a variants generator its recorded children; generator "
                              f"{config.generator!r} makes no variants")
        from kernelcast.storage.dataset import DataRoot
        from kernelcast.tasks.generators import recorded_variants

        try:
            root = DataRoot(config.variants_recorded)
            if not root.fs.exists(root.path):  # a folder moved away mid-run reads as empty: say which it is
                raise ValueError(f"{config.variants_recorded} does not exist (a data root of recorded children: "
                                 "a measured space's or a live search's)")
            if not recorded_variants(config.variants_recorded, config.op):
                raise ValueError(f"{config.variants_recorded} holds no recorded variant children of {config.op}")
        except (ValueError, OSError) as exc:
            raise ConfigError(f"variants_recorded: {exc}") from None
    if config.generator_roots:
        from kernelcast.tasks.generators import base_generator

        if base_generator(config.generator) != "freeform" and config.generator != "variants":
            raise ConfigError(f"generator_roots starts a free-form or variants search from a pool's kernels; "
                              f"generator {config.generator!r} takes none")
        check_roots(config)


def check_roots(config: SearchConfig) -> None:
    """A ConfigError unless ``generator_roots`` (if set) holds the operation's roots on the config's GPU type."""
    if not config.generator_roots:
        return
    from kernelcast.tasks.generators import template_roots

    try:
        template_roots(config.generator_roots, config.op, config.gpu_type)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"generator_roots: {exc}") from None


def check_gpu_type(gpu_type: str) -> None:
    """A ConfigError unless ``gpu_type`` is 'auto', a GPU type this project knows, or the CPU interpreter."""
    from kernelcast.kernels.hardware import INTERPRETER, KNOWN_GPU_TYPES

    if gpu_type != "auto" and gpu_type not in (*KNOWN_GPU_TYPES, INTERPRETER):
        raise ConfigError(f"unknown GPU type {gpu_type!r}; known: auto, {', '.join(KNOWN_GPU_TYPES)}")


def validate(config: SearchConfig) -> SearchConfig:
    """The config with ``run_id`` filled in, or a ConfigError naming the first bad setting."""
    check_settings(config)
    check_operation(config)
    if not config.run_id and config.gpu_type != "auto":
        config = config.replace(run_id=default_run_id(config))
    return config
