# The fp8kv-decode-d512 call (B32 Hq32/Hkv4 D512, lognormal contexts, e4m3 cache, page argv[1] (default 16),
# impl argv[2] (default auto)): 3 warm-up calls, then 2 more (ncu's target).
import sys, types, torch, ffpa_attn
import paged_decode_sweep as pds, compass_serving as cs
page = int(sys.argv[1]) if len(sys.argv) > 1 else 16
impl = sys.argv[2] if len(sys.argv) > 2 else "auto"
args = types.SimpleNamespace(heads_q=32, heads_kv=4, head_dim=512, seed=4321)
lengths = cs.lognormal_lengths(32, 8192, 4 * 8192, cs.draw_seed(4321, "gemma4-b32"))
inputs = pds.make_inputs(args, lengths)
k, v, table = pds.paged_cache(inputs, lengths, page, 4321)
k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
del k, v
one = torch.ones(1, 1, device="cuda", dtype=torch.float32).expand(32, 4)
call = lambda: ffpa_attn.flash_attn_with_kvcache(inputs["q"], k8, v8, cache_seqlens=inputs["seqlens"],
                                                 block_table=table, causal=True, k_descale=one, v_descale=one, impl=impl)
for _ in range(5): call()
torch.cuda.synchronize()
