"""Surrogates by name: ``get_forecaster_factory("learned")()`` gives a fresh, fittable forecaster."""

from __future__ import annotations

from typing import Callable


def _learned():
    from surrogate.learned import LearnedForecaster

    return LearnedForecaster()


def _source():
    from surrogate.source import SourceForecaster

    return SourceForecaster()


def _random():
    from surrogate.baselines import RandomForecaster

    return RandomForecaster()


def _roofline():
    from surrogate.baselines import RooflineForecaster

    return RooflineForecaster()


FACTORIES: dict[str, Callable[[], object]] = {"learned": _learned, "source": _source, "random": _random,
                                               "roofline": _roofline}


def get_forecaster_factory(name: str) -> Callable[[], object]:
    """A callable returning a new forecaster called ``name``; a clear error for an unknown name."""
    try:
        return FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown surrogate {name!r}; known: {', '.join(FACTORIES)}") from None
