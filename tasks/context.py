"""What one search runs on, resolved once by its setup (``kernelcast.tasks.setup.open_context``)."""

from __future__ import annotations

from dataclasses import dataclass

from kernelcast.storage.dataset import DataRoot
from kernelcast.tasks.config import ConfigError, SearchConfig


@dataclass(frozen=True)
class SearchContext:
    """What every step of one search runs on, resolved once at its start: the validated config (backend, GPU
    type and run id settled) and its data root, opened and probed once. ``Search`` holds it; its steps read
    the config and the root from it rather than validating or opening either again."""

    config: SearchConfig
    root: DataRoot

    def __post_init__(self):
        if self.config.gpu_type == "auto" or not self.config.run_id:
            raise ConfigError("resolve gpu_type and run_id (kernelcast.tasks.setup.resolve) before starting a search")

    @property
    def op(self) -> str:
        return self.config.op

    @property
    def gpu_type(self) -> str:
        return self.config.gpu_type

    @property
    def surrogate(self) -> str:
        return self.config.surrogate
