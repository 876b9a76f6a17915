"""Surrogates by name: ``get_forecaster_factory("learned")()`` gives a fresh, fittable forecaster.

Each entry also says how a search readies it: fit on measured pairs first (the prior), read
from the folder a training run wrote (``reads_folder``, ``load_trained``), or used as it is
(``fit(None)``). Callers ask the entry (``fits_on_prior``, ``fit_prior``, ``reads_folder``);
nothing elsewhere branches on a surrogate's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


def _learned(**options):
    from kernelcast.surrogate.learned import LearnedForecaster

    return LearnedForecaster(**options)


def _learned_facts(**options):
    """The learned forecaster whose source part also reads each kernel's facts (``kernelcast.surrogate.physics.
    facts_matrix``)."""
    from kernelcast.surrogate.learned import SOURCE_OPTIONS, LearnedForecaster

    source = {**SOURCE_OPTIONS, **options.pop("source_options", {}), "facts": True}
    return LearnedForecaster(source_options=source, **options)


def _source(**options):
    from kernelcast.surrogate.source import SourceForecaster

    return SourceForecaster(**options)


def _lmhead():
    from kernelcast.surrogate.lmhead import LMHeadForecaster

    return LMHeadForecaster()


def _load_lmhead(folder: str):
    from kernelcast.surrogate.lmhead import LMHeadForecaster

    return LMHeadForecaster.load(folder)


def _physics():
    from kernelcast.surrogate.physics import PhysicsForecaster

    return PhysicsForecaster()


def _physics_probe():
    from kernelcast.surrogate.physics import PhysicsForecaster

    return PhysicsForecaster(probe=True)


def _physics_probe_top():
    from kernelcast.surrogate.physics import PhysicsForecaster

    return PhysicsForecaster(probe=True, probe_top=1)


def _fit_physics(forecaster, pairs, sources):
    """The correction of the GPU model on the written kernels when there are any, the template pairs otherwise."""
    return forecaster.fit(pairs if sources is None else sources)


def _labels(**options):
    from kernelcast.surrogate.labels import LabelForecaster

    return LabelForecaster(**options)


def _fit_labels(forecaster, pairs, sources):
    """The written kernels when there are any (the labels are theirs), the template pairs otherwise."""
    return forecaster.fit(pairs if sources is None else sources)


def _random():
    from kernelcast.surrogate.baselines import RandomForecaster

    return RandomForecaster()


def _roofline():
    from kernelcast.surrogate.baselines import RooflineForecaster

    return RooflineForecaster()


def _oracle():
    from kernelcast.surrogate.baselines import OracleForecaster

    return OracleForecaster()


def _load_oracle(folder: str, read_measurements):
    from kernelcast.surrogate.baselines import OracleForecaster

    return OracleForecaster(read_measurements)


def _fit_learned(forecaster, pairs, sources):
    """Per-case template pairs for the speed model, written kernels (when any) for its source model."""
    return forecaster.fit(pairs, sources=sources)


def _fit_source(forecaster, pairs, sources):
    """The written kernels when there are any, the template pairs otherwise: it reads source alone."""
    return forecaster.fit(pairs if sources is None else sources)


@dataclass(frozen=True)
class SurrogateEntry:
    make: Callable[[], object]
    # (forecaster, measured pairs, written kernels or None) -> fitted forecaster; None: nothing to fit on
    fit_on: Callable[[object, object, object], object] | None = None
    # folder -> the forecaster trained into it (``python -m kernelcast.surrogate.lmhead train --out DIR``); None: none
    load: Callable[..., object] | None = None
    # its folder is a data root whose measurements it forecasts from: load(folder, read) with read(op, gpu_type)
    # giving them (the caller owns the data root)
    reads_measurements: bool = False


SURROGATES: dict[str, SurrogateEntry] = {
    "learned": SurrogateEntry(_learned, _fit_learned), "source": SurrogateEntry(_source, _fit_source),
    "lmhead": SurrogateEntry(_lmhead, load=_load_lmhead), "random": SurrogateEntry(_random), "roofline": SurrogateEntry(_roofline),
    # what each kernel makes the device do, found on the CPU and timed by a GPU model; used as it is (its fit on
    # measured pairs is optional: finding facts for a whole pool takes minutes)
    "physics": SurrogateEntry(_physics),
    # the same with its learned correction fit on the measured pairs (facts found for at most max_fit of them)
    "physics-fit": SurrogateEntry(_physics, _fit_physics),
    # physics, each candidate also run in the harness under Triton's interpreter on its operation's small cases
    # (kernelcast.kernels.probe): a kernel found wrong there is forecast to fail (seconds a kernel on the CPU)
    "physics-probe": SurrogateEntry(_physics_probe),
    # the same, probing only the contenders: each operation's fastest forecast down until one was not found wrong,
    # and those forecast as fast as it (on the zero-shot development problems: 0.18 s a kernel, top-1 kept)
    "physics-probe-top": SurrogateEntry(_physics_probe_top),
    # learned, its source part (every written kernel's speed, every kernel's failure) reading the physics facts too
    "learned-facts": SurrogateEntry(_learned_facts, _fit_learned),
    # the baseline every forecaster table carries: six labels a user has for free (variant kind, the reference's
    # runtime and operator count), boosted
    "labels": SurrogateEntry(_labels, _fit_labels),
    # hindsight, for replays: the measured outcomes of the data root it is given (surrogate_folder)
    "oracle": SurrogateEntry(_oracle, load=_load_oracle, reads_measurements=True)}
FACTORIES: dict[str, Callable[[], object]] = {name: entry.make for name, entry in SURROGATES.items()}


def _entry(name: str) -> SurrogateEntry:
    try:
        return SURROGATES[name]
    except KeyError:
        raise ValueError(f"unknown surrogate {name!r}; known: {', '.join(SURROGATES)}") from None


def get_forecaster_factory(name: str) -> Callable[[], object]:
    """A callable returning a new forecaster called ``name``; a clear error for an unknown name."""
    return _entry(name).make


def fits_on_prior(name: str) -> bool:
    """Whether surrogate ``name`` is fit on measurements (a prior) before it forecasts."""
    return _entry(name).fit_on is not None


def fit_prior(name: str, forecaster, pairs, sources=None):
    """``forecaster`` (made by ``name``'s factory) fit on measured ``pairs`` and written kernels ``sources``."""
    fit = _entry(name).fit_on
    if fit is None:
        raise ValueError(f"surrogate {name!r} is not fit on measurements")
    return fit(forecaster, pairs, sources)


def reads_folder(name: str) -> bool:
    """Whether surrogate ``name`` is read from the folder of a training run rather than fit here."""
    return _entry(name).load is not None


def reads_measurements(name: str) -> bool:
    """Whether surrogate ``name`` forecasts from the measurements of the data root it is given (``load_trained``'s
    ``read_measurements``)."""
    return _entry(name).reads_measurements


def load_trained(name: str, folder: str, read_measurements: Callable[[str, str], object] | None = None):
    """Surrogate ``name`` as trained into ``folder``; a clear error if it is not read from one, or none is given.
    A surrogate that forecasts from a data root's measurements (the oracle) needs ``read_measurements(op,
    gpu_type)``, given by whoever owns that root."""
    entry = _entry(name)
    if entry.load is None:
        raise ValueError(f"surrogate {name!r} is not read from a trained folder")
    if not folder:
        raise ValueError(f"surrogate {name!r} needs the folder it was trained into")
    if not entry.reads_measurements:
        return entry.load(folder)
    if read_measurements is None:
        raise ValueError(f"surrogate {name!r} forecasts from the measurements of the data root {folder}: "
                         "it needs a reader of them")
    return entry.load(folder, read_measurements)
