"""Serving semantics in float64 (docs/spec.md, "Serving semantics"), one sequence at a time, written from
the spec, for the tests of flash_attn_varlen_func and flash_attn_with_kvcache; and random packed batches."""

import math
import random

import torch


def sequence_attention(q, k, v, causal=False, window=(-1, -1), softcap=0.0, sinks=None, scale=None, k_scale=None,
                       v_scale=None):  # fmt: skip
    """o [Nq, Hq, Dv] and lse [Hq, Nq] (float64) of one sequence: q [Nq, Hq, D], k [Nkv, Hkv, D], v [Nkv, Hkv,
    Dv]. Query i sits at key position i + Nkv - Nq (bottom-right); window (left, right), -1 unbounded;
    softcap c > 0: c * tanh(s / c) after scaling; sinks [Hq]: one more logit per row with no value;
    k_scale / v_scale [Hkv]: descales of an e4m3 cache. A row with no attended key: o 0, lse -inf."""
    n_q, heads_q, dim = q.shape
    n_kv, heads_kv = k.shape[0], k.shape[1]
    group = heads_q // heads_kv
    qh = q.double().transpose(0, 1)
    kh, vh = k.double(), v.double()
    if k_scale is not None:
        kh = kh * k_scale.double()[None, :, None]
    if v_scale is not None:
        vh = vh * v_scale.double()[None, :, None]
    kh = kh.transpose(0, 1).repeat_interleave(group, 0)
    vh = vh.transpose(0, 1).repeat_interleave(group, 0)
    scores = qh @ kh.transpose(-1, -2) * (1.0 / math.sqrt(dim) if scale is None else scale)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    position = torch.arange(n_q)[:, None] + n_kv - n_q
    key = torch.arange(n_kv)[None, :]
    allowed = torch.ones(n_q, n_kv, dtype=torch.bool)
    if causal:
        allowed &= key <= position
    if window[0] >= 0:
        allowed &= key >= position - window[0]
    if window[1] >= 0:
        allowed &= key <= position + window[1]
    scores = scores.masked_fill(~allowed, -math.inf)
    logits = scores
    if sinks is not None:
        logits = torch.cat([scores, sinks.double()[:, None, None].expand(heads_q, n_q, 1)], dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    o = (weights @ vh).transpose(0, 1)
    return o, lse


def packed_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k=None, **options):
    """sequence_attention of each sequence of a packed batch: o [total_q, Hq, Dv], lse [Hq, total_q] (rows of
    no sequence: NaN)."""
    o = torch.full((q.shape[0], q.shape[1], v.shape[-1]), math.nan, dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), math.nan, dtype=torch.float64)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cu_q) - 1):
        keys = slice(cu_k[b], cu_k[b + 1] if seqused_k is None else cu_k[b] + int(seqused_k[b]))
        rows = slice(cu_q[b], cu_q[b + 1])
        o[rows], lse[:, rows] = sequence_attention(q[rows], k[keys], v[keys], **options)
    return o, lse


def cumulative(lengths, start=0) -> torch.Tensor:
    """cu_seqlens (int32 [B + 1]) of `lengths`, from `start`."""
    values = [start]
    for length in lengths:
        values.append(values[-1] + length)
    return torch.tensor(values, dtype=torch.int32)


def paged_cache(k: torch.Tensor, cu_seqlens_k: torch.Tensor, page_size: int, rng: random.Random, spare_pages=3):
    """k [total_k, H, D] copied into a paged cache [num_blocks, page_size, H, D] with pages in random order
    (some unused, filled with NaN) and its block table (int32 [B, max_blocks]; unused entries -1)."""
    cu = cu_seqlens_k.tolist()
    lengths = [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    pages_of = [-(-length // page_size) for length in lengths]
    num_blocks = sum(pages_of) + spare_pages
    order = list(range(num_blocks))
    rng.shuffle(order)
    table = torch.full((len(lengths), max(max(pages_of), 1)), -1, dtype=torch.int32)
    for b in range(len(lengths)):
        for i in range(pages_of[b]):
            table[b, i] = order.pop()
    return same_pages(k, cu_seqlens_k, table, num_blocks, page_size), table


def same_pages(x: torch.Tensor, cu_seqlens: torch.Tensor, table: torch.Tensor, num_blocks: int, page_size: int):
    """x [total, H, D] laid into a paged cache [num_blocks, page_size, H, D] (NaN elsewhere) by `table`."""
    cache = torch.full((num_blocks, page_size, *x.shape[1:]), math.nan, dtype=x.dtype)
    cu = cu_seqlens.tolist()
    for b in range(len(cu) - 1):
        for j in range(cu[b + 1] - cu[b]):
            cache[int(table[b, j // page_size]), j % page_size] = x[cu[b] + j]
    return cache


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str) -> None:
    """Finite where expected is, within `tolerance` relative to the largest magnitude."""
    actual = actual.double()
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(actual), finite), f"{what}: non-finite entries differ"
    error = (actual[finite] - expected[finite]).abs().max().item() if finite.any() else 0.0
    bound = tolerance * max(1.0, expected[finite].abs().max().item() if finite.any() else 1.0)
    assert error <= bound, f"{what}: max error {error:.3e} > {bound:.3e}"
