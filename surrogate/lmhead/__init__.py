"""A code language model (Qwen2.5-Coder, or any causal LM transformers loads) read as a forecaster.

The (anchor, candidate) source pair goes through the model with a LoRA adapter (rank 8 on the
attention projections); small heads on the pooled last hidden state give the failure logit and
a Gaussian over the candidate's log speedup against its anchor (``model``). ``train`` fits them on
measured pairs with whole problems held out and calibrates them on a split of problems kept out
of training; ``python -m kernelcast.surrogate.lmhead train`` is its command line. The registry's ``lmhead``
forecaster reads the folder a training run writes.
"""

from kernelcast.surrogate.lmhead.model import HeadConfig, LMHeadForecaster, append_embeddings

__all__ = ["HeadConfig", "LMHeadForecaster", "append_embeddings"]
