"""The CallSpec the torch-free decision and routing tests start from."""

from ffpa_attn.decisions import CallSpec


def served_call_spec(q_shape: tuple, k_shape: tuple, v_shape: tuple, **changes) -> CallSpec:
    """A call the library serves (bf16 CUDA tensors of these shapes, no mask), with `changes` applied."""
    fields = dict(
        device_type="cuda",
        same_device=True,
        dtype="bfloat16",
        kv_dtypes_match=True,
        q_shape=q_shape,
        k_shape=k_shape,
        v_shape=v_shape,
        mask_dtype=None,
        mask_shape=None,
        dropout_p=0.0,
        enable_gqa=False,
        needs_grad=False,
        nested=False,
    )
    fields.update(changes)
    return CallSpec(**fields)
