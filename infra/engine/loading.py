"""Loading the engine's model: tokenizer and weights from a GGUF file or a transformers folder, the
chat template it prompts with, and the tokens that end its replies."""

from __future__ import annotations

import importlib.util
import inspect
import os
from pathlib import Path

import torch

# Qwen2 instruct models are trained on ChatML; some GGUF exports of them carry no
# ``tokenizer.chat_template``, and then this one stands in (for qwen2 models only: another
# family's prompt format cannot be guessed, and a wrong one silently ruins its answers).
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHATML_FAMILIES = ("qwen2",)
# Chat models end a turn with one of these; a GGUF names a single EOS, often the other one.
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def _dequantizing(kwargs: dict) -> dict:
    """Ask transformers to unpack GGUF blocks into dense weights at load time, where it can keep them packed.

    A batched decode multiplies hundreds of rows by each weight: dense matmuls serve that, while
    packed GGUF layers unpack their blocks on every call above a few rows (and would first try
    to fetch a kernel from a hub). Releases without ``GgufConfig(dequantize=...)`` always unpack.
    """
    try:
        from transformers import GgufConfig
    except ImportError:
        return kwargs
    if "dequantize" not in inspect.signature(GgufConfig).parameters:
        return kwargs
    return {**kwargs, "quantization_config": GgufConfig(dequantize=True)}


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA GPU")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    # bfloat16 on a GPU; float32 on a CPU, where bfloat16 matmuls are slow on most cores.
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    known = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if dtype not in known:
        raise ValueError(f"unknown dtype {dtype!r}; known: auto, {', '.join(known)}")
    return known[dtype]


def load(model: str | os.PathLike, *, device: str = "auto", dtype: str = "auto"):
    """(tokenizer, model) from a ``.gguf`` file or a transformers folder, the model on ``device`` in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model {str(model)!r} not found: expected a .gguf file or a transformers folder")
    device = resolve_device(device)
    kwargs = {}
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model file {path} is not a .gguf file")
        if importlib.util.find_spec("gguf") is None:
            raise ImportError("transformers reads a .gguf file with the pure-Python 'gguf' package, which is not "
                              "installed: pip install --no-deps gguf (or a gguf-*.whl carried to this machine)")
        kwargs = _dequantizing({"gguf_file": path.name})
        path = path.parent
    tokenizer = AutoTokenizer.from_pretrained(str(path), **{k: v for k, v in kwargs.items() if k == "gguf_file"})
    net = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype, device), **kwargs)
    return tokenizer, net.to(device).eval()


def chat_template(tokenizer, config, override: str | None = None) -> str:
    """The chat template: ``override``, else the model's own (GGUF metadata), else ChatML for qwen2 models."""
    if override:
        return override
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.chat_template
    if getattr(config, "model_type", None) in CHATML_FAMILIES:
        return CHATML
    raise ValueError(f"the model ({getattr(config, 'model_type', '?')}) carries no chat template; "
                     "pass --chat-template FILE with its Jinja template")


def end_token_ids(tokenizer, model) -> frozenset[int]:
    """Token ids that end a reply: the model's EOS ids and any end-of-turn token its vocabulary has."""
    ids = set()
    for value in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        ids.update(value if isinstance(value, (list, tuple)) else [value] if value is not None else [])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in END_OF_TURN if t in vocab)
    return frozenset(ids)
