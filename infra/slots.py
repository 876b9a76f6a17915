"""A KV cache of fixed slots, one request per slot, and the attention that reads it.

Continuous batching needs every row of a batch to have its own length: a request that
finishes frees its slot, and a new one is prefilled into it while the others keep decoding.
transformers' caches keep one length for the whole batch (left padding) and grow by
concatenation, copying the whole cache every step. Here each layer's keys and values live in
one buffer allocated once, ``[slots, kv_heads, slot_tokens, head_dim]``; a decode step writes
each slot's new key and value at that slot's own length, and the attention reads the columns
up to it. Grouped-query heads are read in place (queries grouped per key/value head), never
repeated: repeating them multiplied the bytes each decode step reads by the group size.

``register(model)`` points a transformers model's attention at ``slot_attention``. It is
used by both passes:

* prefill (``mask`` None, several query positions): the prompts of newly admitted requests,
  right-padded, with causal attention; each row's keys and values are written into its slot.
  A real token never attends to the padding after it, and padding is never read later.
* decode (one query position, ``mask`` ``[slots, 1, 1, span]``): column ``j`` of slot ``r``
  is attended to when ``j <= length[r]``.

Only the standard library, torch and transformers are imported (the engine runs without
kernelcast's other dependencies).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTENTION = "kernelcast_slots"


class SlotCache:
    """Per-layer key/value buffers for ``slots`` requests of up to ``slot_tokens`` tokens each.

    The model calls ``update`` once per layer per forward; what it writes depends on the pass
    the engine set up with ``prefilling`` or ``decoding`` before the forward.
    """

    def __init__(self, config, slots: int, slot_tokens: int, *, device, dtype):
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (slots, heads, slot_tokens, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.slots, self.slot_tokens = slots, slot_tokens
        self._rows: torch.Tensor | None = None  # prefill: the slots the prompts go to
        self._lengths: torch.Tensor | None = None  # decode: where each slot's new column goes
        self._span = 0  # decode: columns the attention reads

    @staticmethod
    def bytes_per_token(config, dtype: torch.dtype) -> int:
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 2 * config.num_hidden_layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def prefilling(self, rows: torch.Tensor) -> None:
        """The next forward prefills prompts into the slots ``rows`` (one per prompt), from column 0."""
        self._rows, self._lengths = rows, None

    def decoding(self, lengths: torch.Tensor, rows: int) -> torch.Tensor:
        """The next forward decodes one token for slots ``0..rows-1``, each written at its ``lengths``
        column; returns the attention mask ``[rows, 1, 1, span]`` (True: attend)."""
        self._rows, self._lengths = None, lengths[:rows]
        self._span = int(self._lengths.max()) + 1
        columns = torch.arange(self._span, device=lengths.device)
        return (columns[None, :] <= self._lengths[:, None])[:, None, None, :]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Store this forward's keys and values of layer ``layer_idx``; return what the attention reads."""
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self._lengths is None:  # prefill: the prompt's own keys are all it attends to
            n = key_states.shape[2]
            keys[self._rows, :, :n] = key_states
            values[self._rows, :, :n] = value_states
            return key_states, value_states
        rows = torch.arange(len(self._lengths), device=self._lengths.device)
        keys[rows, :, self._lengths] = key_states[:, :, 0]
        values[rows, :, self._lengths] = value_states[:, :, 0]
        n = len(self._lengths)
        return keys[:n, :, :self._span], values[:n, :, :self._span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._span


def slot_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention over a ``SlotCache``: causal over the prompt when ``attention_mask`` is None (prefill),
    else one query per row over that row's columns. Returns ``[batch, queries, heads, head_dim]``."""
    if kwargs.get("sliding_window"):
        raise ValueError("slot attention has no sliding window; this model's layers need one")
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    if attention_mask is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=queries > 1, scale=scaling,
                                             enable_gqa=kv_heads != heads)
        return out.transpose(1, 2).contiguous(), None
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # queries == 1
    scale = scaling if scaling is not None else dim ** -0.5
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale
    scores = scores.masked_fill(~attention_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).reshape(batch, heads, 1, dim)
    return out.transpose(1, 2).contiguous(), None


def register(model) -> None:
    """Make ``model``'s attention ``slot_attention`` (the engine then passes masks itself)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, slot_attention)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION)
    else:
        model.config._attn_implementation = ATTENTION


def masks(model, mask) -> dict:
    """The per-layer-type mask mapping a transformers model takes as given (no mask is built for it)."""
    types = set(getattr(model.config, "layer_types", None) or ("full_attention",))
    return {kind: mask for kind in types | {"full_attention"}}
