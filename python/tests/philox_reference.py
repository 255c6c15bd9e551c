"""The library's dropout keep-mask (src/common/philox.hpp), re-implemented for the tests.

Philox4x32-10 here runs on Python ints (no numpy needed: the known-answer
tests run in CI) and on numpy uint64 arrays (vectorized: the keep-mask of a
whole [B, Hq, Nq, Nkv] problem in one pass). 32-bit words are held in 64-bit
integers and masked after every operation that could overflow 32 bits; the
products of two 32-bit words fit in 64 bits exactly, which is all mulhilo needs.

For query head h of batch b (bh = b * Hq + h), row i and key j:
    counter = {j / 4, i, bh, lo32(offset)}
    key     = {lo32(seed), hi32(seed) ^ hi32(offset)}
    bits    = Philox4x32-10(counter, key)[j % 4]
    keep    = bits >= threshold,  threshold = round(p * 2^32) (saturated),
with p rounded to float32 first, as the C ABI carries it.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

MASK32 = 0xFFFFFFFF
PHILOX_MUL0, PHILOX_MUL1 = 0xD2511F53, 0xCD9E8D57
PHILOX_WEYL0, PHILOX_WEYL1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10

# A 32-bit word: a Python int, or a numpy uint64 array of words (broadcastable).
Word = Any


def philox4x32_10(counter: tuple[Word, Word, Word, Word], key0: int, key1: int) -> tuple[Word, Word, Word, Word]:
    """Philox4x32-10 of `counter` under key {key0, key1}, word for word as philox.hpp."""
    c0, c1, c2, c3 = counter
    k0, k1 = key0 & MASK32, key1 & MASK32
    for _ in range(PHILOX_ROUNDS):
        product0 = PHILOX_MUL0 * c0
        product1 = PHILOX_MUL1 * c2
        c0, c1, c2, c3 = (
            (product1 >> 32) ^ c1 ^ k0,
            product1 & MASK32,
            (product0 >> 32) ^ c3 ^ k1,
            product0 & MASK32,
        )
        k0 = (k0 + PHILOX_WEYL0) & MASK32
        k1 = (k1 + PHILOX_WEYL1) & MASK32
    return c0, c1, c2, c3


def dropout_counter_key(seed: int, offset: int, bh: Word, i: Word, j_block: Word) -> tuple[tuple[Word, ...], int, int]:
    """The Philox counter and key of keys 4*j_block .. 4*j_block+3 of row i of head bh."""
    counter = (j_block, i, bh, offset & MASK32)
    return counter, seed & MASK32, ((seed >> 32) ^ (offset >> 32)) & MASK32


def dropout_threshold(p: float) -> int:
    """round(p * 2^32) with p as the float32 the C ABI carries, saturated at 2^32 - 1."""
    p_float32 = struct.unpack("f", struct.pack("f", p))[0]
    t = p_float32 * 4294967296.0 + 0.5
    return MASK32 if t >= 4294967295.0 else int(t)


def dropout_keep_mask(
    seed: int, offset: int, batch: int, heads_q: int, seq_q: int, seq_kv: int, p: float
) -> np.ndarray:
    """Boolean keep-mask [batch, heads_q, seq_q, seq_kv] of dropout probability p."""
    import numpy as np

    blocks = (seq_kv + 3) // 4
    bh = np.arange(batch * heads_q, dtype=np.uint64).reshape(-1, 1, 1)
    i = np.arange(seq_q, dtype=np.uint64).reshape(1, -1, 1)
    j_block = np.arange(blocks, dtype=np.uint64).reshape(1, 1, -1)
    counter, key0, key1 = dropout_counter_key(seed, offset, bh, i, j_block)
    words = np.broadcast_arrays(*philox4x32_10(counter, key0, key1))
    # Word j % 4 of block j / 4 is key j's draw: interleave the four words along the keys.
    bits = np.stack(words, axis=-1).reshape(batch * heads_q, seq_q, blocks * 4)[:, :, :seq_kv]
    keep = bits >= np.uint64(dropout_threshold(p))
    return keep.reshape(batch, heads_q, seq_q, seq_kv)
