"""ffpa as an attention implementation of Hugging Face transformers (its AttentionInterface).

    import ffpa_attn.integrations.transformers  # registers "ffpa" and "paged|ffpa"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="ffpa")

Importing this module registers (register(), idempotent):
  - "ffpa": padded batches go to ffpa_attn_func, the SDPA drop-in, with transformers' SDPA masks (the
    mask interface of "ffpa" is sdpa_mask), exactly as transformers' "sdpa" calls SDPA. Padding-free
    packed batches (position_ids restarting per sequence in a batch of one, or cu_seq_lens_* kwargs, as
    transformers' FlashAttention path reads them) go to flash_attn_varlen_func; where gradients are needed
    and the library's backward does not take such a call (decide.packed_backward_refusal), or with
    dropout, they go to the drop-in with transformers' block-diagonal mask, which has a backward.
  - "paged|ffpa": transformers' continuous batching. Full-attention layers write the new keys into the
    paged cache and read it in place through a block table made from transformers' read indices (no
    gather); sliding-window layers take the window's keys from the cache's update (transformers' ring
    buffer is no block table) and run packed. A decode batch that transformers gives a block table
    (its fast path) runs flash_attn_with_kvcache on the paged cache.
Sliding windows ((w - 1, w - 1) with causal, as transformers' FlashAttention path), logit softcap and
sinks (s_aux) go to the library on the packed and paged paths; a padded batch with softcap or sinks
raises NotImplementedError (the drop-in is SDPA's signature, which has neither).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

from .. import decide
from ..flash_attn_interface import flash_attn_varlen_func, flash_attn_with_kvcache
from ..functional import ffpa_attn_func

NAME = "ffpa"
PAGED_NAME = "paged|ffpa"


def ffpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | torch.Tensor | None = None,
    max_length_k: int | torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention call: query [B, Hq, N, D], key / value [B, Hkv, Nkv, D / Dv], attention_mask
    SDPA's (bool [B, 1, N, Nkv] or None); returns ([B, N, Hq, Dv], None)."""
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = _window(sliding_window)
    softcap = softcap or 0.0
    packed = cu_seq_lens_q is not None and cu_seq_lens_k is not None
    if not packed and position_ids is not None and query.shape[0] == 1:
        packed = _restarts(position_ids)
    if packed:
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        refusal = decide.packed_backward_refusal(window != (-1, -1), softcap > 0) if needs_grad else None
        if cu_seq_lens_q is None or cu_seq_lens_k is None:
            (cu_seq_lens_q, cu_seq_lens_k), (max_length_q, max_length_k) = prepare_fa_kwargs_from_position_ids(
                position_ids
            )
        if refusal is None and dropout == 0.0:
            out = flash_attn_varlen_func(
                _tokens(query), _tokens(key), _tokens(value), cu_seq_lens_q, cu_seq_lens_k,
                _bound(max_length_q), _bound(max_length_k), softmax_scale=scaling, causal=is_causal,
                window_size=window, softcap=softcap, s_aux=s_aux,
            )  # fmt: skip
            return out.view(query.shape[0], query.shape[2], *out.shape[1:]), None
        # The drop-in trains on the block-diagonal mask of the packing (transformers builds one only
        # without a cache object, so it is made here from the sequences' offsets).
        if key.shape[2] != query.shape[2] or cu_seq_lens_k is not cu_seq_lens_q and not torch.equal(
            cu_seq_lens_k, cu_seq_lens_q
        ):
            raise NotImplementedError(f"ffpa: packed keys other than the queries' tokens: {refusal}")
        attention_mask = _block_diagonal_mask(cu_seq_lens_q, query.shape[2], is_causal, window)
        is_causal = False
    if softcap or s_aux is not None:
        raise NotImplementedError(
            "ffpa: " + ("softcap" if softcap else "sinks (s_aux)") + " on a call the SDPA drop-in serves (a padded "
            "batch, or a padding-free one that trains where the library's backward takes no such batch) is not "
            "served: the drop-in takes neither"
        )
    # SDPA's causal flag is top-left: transformers' "sdpa" rules for it.
    q_length, kv_length = query.shape[2], key.shape[2]
    is_causal = q_length > 1 and attention_mask is None and is_causal
    if is_causal and kv_length > q_length:
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = ffpa_attn_func(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, is_causal=is_causal, scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # fmt: skip
    return out.transpose(1, 2), None


def ffpa_paged_attention_forward(
    module: torch.nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    cache=None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | dict | None = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int | dict = 0,
    block_table: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' continuous batching call (its "paged|" attention): q [1, Hq, total_q, D] packed,
    k / v the new tokens' [1, Hkv, total_q, D], cache its PagedAttentionCache (per layer
    [(num_blocks + 2) * block_size, Hkv, D]); returns ([total_q, Hq, Dv], None)."""
    if cache is None:
        raise ValueError(f"{PAGED_NAME} was called without transformers' paged attention cache (continuous batching)")
    sliding = bool(getattr(module, "sliding_window", None))
    window = (module.sliding_window - 1, 0) if sliding else (-1, -1)
    layer_type = "sliding_attention" if sliding else "full_attention"
    if isinstance(cu_seq_lens_k, dict):
        cu_seq_lens_k, max_seqlen_k = cu_seq_lens_k[layer_type], max_seqlen_k[layer_type]
    scale = getattr(module, "scaling", None)
    s_aux = kwargs.get("s_aux")
    group, index_in_group = cache.layer_index_to_group_indices[module.layer_idx]
    k_cache, v_cache = cache.key_cache[index_in_group], cache.value_cache[index_in_group]
    pages = (-1, cache.block_size, cache.num_key_value_heads, cache.head_dim)
    if block_table is not None:
        # transformers' decode fast path: one new token a sequence, appended through the block table.
        # cu_seq_lens_k counts it; the cache held one fewer.
        batch = q.shape[2]
        cache_seqlens = (cu_seq_lens_k[1 : batch + 1] - cu_seq_lens_k[:batch] - 1).to(torch.int32)
        out = flash_attn_with_kvcache(
            q.permute(2, 0, 1, 3), k_cache.view(pages), v_cache.view(pages), k.permute(2, 0, 1, 3),
            v.permute(2, 0, 1, 3), cache_seqlens=cache_seqlens, block_table=block_table[group], softmax_scale=scale,
            causal=True, window_size=window, s_aux=s_aux,
        )  # fmt: skip
        return out.squeeze(1), None
    read_index, write_index = kwargs["read_index"][group], kwargs["write_index"][group]
    if sliding or read_index.numel() == 0:
        # Sliding layers: the window's keys from transformers' ring buffer, gathered by its update. A batch
        # that reads no cache: its keys are the new ones (update writes them).
        keys, values = cache.update(k, v, module.layer_idx, kwargs["read_index"], kwargs["write_index"])
        out = flash_attn_varlen_func(
            _tokens(q), keys, values, cu_seq_lens_q, cu_seq_lens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale=scale, causal=True, window_size=window, s_aux=s_aux,
        )  # fmt: skip
        return out, None
    # Full attention: write the new keys, then read the cache in place through a block table. Sequence
    # b's keys are read_index[cu_k[b] : cu_k[b + 1]], block by block in order, so its page i is
    # read_index[cu_k[b] + i * block_size] // block_size.
    k_cache.index_copy_(0, write_index, _tokens(k))
    v_cache.index_copy_(0, write_index, _tokens(v))
    width = -(-max(max_seqlen_k, 1) // cache.block_size)  # pages of the longest sequence (a bound)
    first_keys = cu_seq_lens_k[:-1, None].long() + torch.arange(width, device=q.device) * cache.block_size
    table = (read_index[first_keys.clamp_(max=read_index.numel() - 1)] // cache.block_size).to(torch.int32)
    out = flash_attn_varlen_func(
        _tokens(q), k_cache.view(pages), v_cache.view(pages), cu_seq_lens_q, cu_seq_lens_k, max_seqlen_q,
        max_seqlen_k, softmax_scale=scale, causal=True, window_size=window, block_table=table, s_aux=s_aux,
    )  # fmt: skip
    return out, None


def register() -> None:
    """Registers "ffpa" (with SDPA's masks) and "paged|ffpa" with transformers (idempotent)."""
    AttentionInterface.register(NAME, ffpa_attention_forward)
    AttentionInterface.register(PAGED_NAME, ffpa_paged_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def _tokens(t: torch.Tensor) -> torch.Tensor:
    """[1, H, total, D] (transformers' packed states) as FlashAttention's [total, H, D] (a view)."""
    return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])


def _restarts(position_ids: torch.Tensor) -> bool:
    """Whether a batch of one holds several sequences (positions restart), as transformers' FlashAttention
    path decides it (a host read, as there)."""
    positions = position_ids.reshape(-1)
    return bool((positions - positions.min() != torch.arange(positions.numel(), device=positions.device)).any())


def _block_diagonal_mask(cu_seqlens: torch.Tensor, total: int, causal: bool, window: tuple[int, int]) -> torch.Tensor:
    """bool [1, 1, total, total], True = attend: packed tokens attend their own sequence's, within the
    causal limit and the window (the serving semantics of a packed self-attention call, as a mask)."""
    tokens = torch.arange(total, device=cu_seqlens.device)
    sequence = torch.searchsorted(cu_seqlens[1:].to(torch.int64), tokens, right=True)
    offset = tokens - cu_seqlens.to(torch.int64)[sequence]  # the token's position in its sequence
    behind = offset[:, None] - offset[None, :]  # how far key j is behind query i
    allowed = sequence[:, None] == sequence[None, :]
    if causal:
        allowed &= behind >= 0
    if window[0] >= 0:
        allowed &= behind <= window[0]
    if window[1] >= 0:
        allowed &= -behind <= window[1]
    return allowed[None, None]


def _window(sliding_window: int | None) -> tuple[int, int]:
    # transformers' window counts the query's own key: w keys, (w - 1, w - 1) in FlashAttention's bounds.
    return (sliding_window - 1, sliding_window - 1) if sliding_window else (-1, -1)


def _bound(max_length: int | torch.Tensor | None) -> int | torch.Tensor:
    return 0 if max_length is None else max_length


register()
