"""The tests' Philox keep-mask reproduces philox.hpp: Random123's known answers,
the counter/key layout of dropout_bits, the threshold rounding, and the
vectorized mask against the scalar generator."""

import math

import pytest

from philox_reference import (
    MASK32,
    dropout_counter_key,
    dropout_keep_mask,
    dropout_threshold,
    philox4x32_10,
)


# Known-answer vectors of Random123 (kat_vectors, philox4x32 10 rounds), as tests/cpu/test_philox.cpp.
@pytest.mark.parametrize(
    ("counter", "key", "expected"),
    [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((MASK32,) * 4, (MASK32, MASK32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ],
    ids=["zeros", "ones", "pi-digits"],
)
def test_philox_known_answers(counter, key, expected):
    assert philox4x32_10(counter, *key) == expected


def test_dropout_counter_and_key_layout():
    # The same case as DropoutBitsCounterAndKeyLayout in tests/cpu/test_philox.cpp.
    seed, offset = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    counter, key0, key1 = dropout_counter_key(seed, offset, bh=77, i=1234, j_block=(4 * 999 + 2) // 4)
    assert counter == (999, 1234, 77, 0x76543210)
    assert (key0, key1) == (0x89ABCDEF, 0x01234567 ^ 0xFEDCBA98)


@pytest.mark.parametrize(
    ("p", "threshold"),
    [
        (0.0, 0),
        (0.5, 0x80000000),
        (0.25, 0x40000000),
        (1e-10, 0),  # rounds to no drop at all
        (1.0 - 2.0**-24, 0xFFFFFF00),  # the largest float32 below 1: 2^32 - 256, exactly
        (1.0, MASK32),  # saturates instead of wrapping to 0
        (2.0, MASK32),
    ],
)
def test_dropout_threshold(p, threshold):
    assert dropout_threshold(p) == threshold


def test_keep_mask_matches_scalar_generator(seed):
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(seed)
    dropout_seed, offset = (int(x) for x in rng.integers(0, 2**63, size=2, dtype=np.int64))
    offset |= 1 << 40  # exercise the high half of the offset, which goes into the key
    batch, heads_q, seq_q, seq_kv, p = 2, 3, 17, 13, 0.3
    keep = dropout_keep_mask(dropout_seed, offset, batch, heads_q, seq_q, seq_kv, p)
    assert keep.shape == (batch, heads_q, seq_q, seq_kv) and keep.dtype == np.bool_
    threshold = dropout_threshold(p)
    for b in range(batch):
        for h in range(heads_q):
            for i in range(seq_q):
                for j in range(seq_kv):
                    counter, key0, key1 = dropout_counter_key(dropout_seed, offset, b * heads_q + h, i, j // 4)
                    bits = philox4x32_10(counter, key0, key1)[j % 4]
                    assert keep[b, h, i, j] == (bits >= threshold), (b, h, i, j)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_matches_probability(seed, p):
    pytest.importorskip("numpy")
    keep = dropout_keep_mask(seed, 7, 1, 2, 500, 1000, p)
    sigma = math.sqrt(p * (1 - p) / keep.size)
    assert abs(keep.mean() - (1 - p)) <= 5 * sigma
