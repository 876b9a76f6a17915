"""A batched generation engine behind an OpenAI-compatible chat endpoint, on torch and transformers alone.

Where vLLM is installed, ``vllm serve`` is the engine to use; where neither vLLM nor
llama.cpp is (a GPU image with torch and transformers only), this one serves a GGUF file
(dequantized by transformers) or a transformers model folder:

    python -m kernelcast.infra.engine --model qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --port 8000

One module per job:

- ``loading``: the tokenizer and model from a ``.gguf`` file or a folder, the chat template, end tokens;
- ``api``: an OpenAI chat request read into a ``Job`` (its ``Sampling``), or refused with ``RequestError``;
- ``batching``: the ``Engine`` (queue, worker thread, slot KV cache, continuous batching) and ``sample``;
- ``server``: the HTTP routes and the command line.

Only the standard library, torch and transformers (with the ``gguf`` package for GGUF
files) are imported, so it runs where kernelcast's other dependencies are missing.
"""

import os

# The KV cache grows by one column every step; with the default allocator each step's slightly larger
# blocks fragment the pool until it holds most of the GPU (72 GiB seen on an H100 for a 3 GiB model),
# leaving nothing for kernels measured between generations. Expandable segments grow in place. Set here,
# before any module of the engine imports torch: CUDA reads it once, at start.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from kernelcast.infra.engine.api import UNSUPPORTED, Job, RequestError, Sampling, read_request  # noqa: E402
from kernelcast.infra.engine.batching import GATHER_LIMIT_S, LOCK_PAUSE_S, SLOT_ROUNDING, TOP_K, Engine, sample  # noqa: E402
from kernelcast.infra.engine.loading import (CHATML, CHATML_FAMILIES, END_OF_TURN, chat_template,  # noqa: E402
                                  end_token_ids, load, resolve_device, resolve_dtype)
from kernelcast.infra.engine.server import DESCRIPTION, completion, main, make_server  # noqa: E402

__all__ = ["CHATML", "CHATML_FAMILIES", "DESCRIPTION", "END_OF_TURN", "GATHER_LIMIT_S", "LOCK_PAUSE_S", "SLOT_ROUNDING",
           "TOP_K", "UNSUPPORTED", "Engine", "Job", "RequestError", "Sampling", "chat_template", "completion",
           "end_token_ids", "load", "main", "make_server", "read_request", "resolve_device", "resolve_dtype",
           "sample"]
