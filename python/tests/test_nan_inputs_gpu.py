"""A NaN input reaches the rows it touches (issue 31; docs/spec.md, "Non-finite
inputs"): the issue's exact call, q [1, 2, 128, 512] bf16 with one NaN in
query row 7 and 256 keys, through ffpa_attn_func on every path that serves it
(the library's own choice, each family, FP8), against SDPA: that row is NaN
(its LSE too), every other row is finite and matches SDPA."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

from attention_reference import ORIGINAL_SDPA  # noqa: E402

from ffpa_attn import CUDABackend, ffpa_attn_func  # noqa: E402

BACKENDS = {
    "ffpa": CUDABackend(impl="ffpa"),
    "sm80_split_d": CUDABackend(impl="sm80_split_d"),
    "sm90_wgmma": CUDABackend(impl="sm90_wgmma"),
    "fp8": CUDABackend(impl="ffpa", precision="fp8"),
}


@pytest.mark.parametrize("path", BACKENDS)
def test_one_nan_in_a_query_row_reaches_that_row_only(path):
    q = torch.randn(1, 2, 128, 512, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 256, 512, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 2, 256, 512, device="cuda", dtype=torch.bfloat16)
    q[0, 1, 7, 100] = float("nan")
    try:
        out, lse = ffpa_attn_func(q, k, v, backend=BACKENDS[path], return_lse=True)
    except NotImplementedError as why:  # this GPU or build has no such path
        pytest.skip(str(why))
    torch.cuda.synchronize()
    want = ORIGINAL_SDPA(q, k, v)
    touched = torch.zeros(1, 2, 128, dtype=torch.bool, device="cuda")
    touched[0, 1, 7] = True
    assert torch.isnan(want[touched]).all(), "SDPA itself gives NaN in the row"
    assert torch.isnan(out[touched]).all(), "the NaN row comes out NaN"
    assert torch.isnan(lse[touched]).all(), "and so does its LSE"
    assert torch.isfinite(out[~touched]).all(), "no other row is touched"
    assert torch.isfinite(lse[~touched]).all()
    got, ref = out[~touched].float(), want[~touched].float()
    relative_l2 = ((got - ref).norm() / ref.norm()).item()
    assert relative_l2 <= (5e-2 if path == "fp8" else 1e-2), f"relative L2 {relative_l2} against SDPA"


def test_a_row_that_masking_empties_stays_zero_with_a_nan_value():
    """A NaN in V of keys a row does not attend: the row masking alone empties
    stays 0 (LSE -inf); a row that attends other keys gets NaN in that column
    (0 x NaN, as SDPA's math gives)."""
    q = torch.randn(1, 1, 64, 512, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, 200, 512, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 1, 200, 512, device="cuda", dtype=torch.bfloat16)
    v[0, 0, 10, 3] = float("nan")
    mask = torch.ones(1, 1, 64, 200, dtype=torch.bool, device="cuda")
    mask[0, 0, 5, :] = False  # row 5 attends no key
    mask[0, 0, :, 10] = False  # no row attends key 10
    out, lse = ffpa_attn_func(q, k, v, attn_mask=mask, backend=CUDABackend(impl="ffpa"), return_lse=True)
    torch.cuda.synchronize()
    assert (out[0, 0, 5] == 0).all() and lse[0, 0, 5] == float("-inf")
    others = torch.ones(64, dtype=torch.bool, device="cuda")
    others[5] = False
    assert torch.isnan(out[0, 0, others, 3]).all()
    assert torch.isfinite(lse[0, 0, others]).all()
    columns = torch.ones(512, dtype=torch.bool, device="cuda")
    columns[3] = False
    assert torch.isfinite(out[0, 0][others][:, columns]).all()
