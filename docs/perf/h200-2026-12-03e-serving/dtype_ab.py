# e4m3-cache decode (B32 Hq32/Hkv4 D512, lognormal contexts, page 16): bf16 q vs f16 q, sm90 and sm80, one process.
import types, torch, ffpa_attn
import paged_decode_sweep as pds, compass_serving as cs
args = types.SimpleNamespace(heads_q=32, heads_kv=4, head_dim=512, seed=4321)
lengths = cs.lognormal_lengths(32, 8192, 4 * 8192, cs.draw_seed(4321, "gemma4-b32"))
inputs = pds.make_inputs(args, lengths)
k, v, table = pds.paged_cache(inputs, lengths, 16, 4321)
k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
kh, vh = k.half(), v.half()
del k, v
one = torch.ones(1, 1, device="cuda", dtype=torch.float32).expand(32, 4)
cols = {}
for dt in (torch.bfloat16, torch.float16):
    q = inputs["q"].to(dt)
    for impl in ("sm90_wgmma", "sm80_split_d"):
        cols[f"e4m3 {str(dt)[6:]} {impl}"] = (lambda q=q, impl=impl: ffpa_attn.flash_attn_with_kvcache(
            q, k8, v8, cache_seqlens=inputs["seqlens"], block_table=table, causal=True, k_descale=one, v_descale=one, impl=impl))
q16 = inputs["q"].half()
cols["f16 cache f16 sm90"] = lambda: ffpa_attn.flash_attn_with_kvcache(q16, kh, vh, cache_seqlens=inputs["seqlens"],
                                                                       block_table=table, causal=True, impl="sm90_wgmma")
ms = pds.time_columns(cols, 3, 20)
for n, t in ms.items():
    ker = [f"{us:.0f}" for name, us in pds.kernels_of(cols[n]) if "forward_kernel" in name]
    print(f"{n:28s} {t:.3f} ms  kernel us {ker}")
