# ncu target: the fp8kv-decode-d512 call (B32 Hq32/Hkv4 D512, lognormal contexts, page 16, e4m3 cache), 6 calls;
# prints the kernels of one call and its time.
import sys, types, torch, ffpa_attn
sys.path.insert(0, "bench")
import paged_decode_sweep as pds, compass_serving as cs
args = types.SimpleNamespace(heads_q=32, heads_kv=4, head_dim=512, seed=4321)
lengths = cs.lognormal_lengths(32, 8192, 4 * 8192, cs.draw_seed(4321, "gemma4-b32"))
inputs = pds.make_inputs(args, lengths)
k, v, table = pds.paged_cache(inputs, lengths, 16, 4321)
k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
del k, v
one = torch.ones(1, 1, device="cuda", dtype=torch.float32).expand(32, 4)
call = lambda: ffpa_attn.flash_attn_with_kvcache(inputs["q"], k8, v8, cache_seqlens=inputs["seqlens"],
                                                 block_table=table, causal=True, k_descale=one, v_descale=one)
for _ in range(3): call()
torch.cuda.synchronize()
if len(sys.argv) > 1:
    for name, t in pds.kernels_of(call): print(f"{t:9.1f} us  {name}")
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20): call()
    e.record(); e.synchronize(); print("call ms", s.elapsed_time(e) / 20)
