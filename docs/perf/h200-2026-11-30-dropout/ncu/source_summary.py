import csv, sys, re, collections
def load(f):
    rows = list(csv.reader(open(f)))
    hdr = rows[1]; data = rows[2:]
    ix = {h:i for i,h in enumerate(hdr)}
    return hdr, ix, data
for f in sys.argv[1:]:
    hdr, ix, data = load(f)
    tot_inst = sum(float(r[ix["Instructions Executed"]] or 0) for r in data)
    tot_samp = sum(float(r[ix["Warp Stall Sampling (All Samples)"]] or 0) for r in data)
    ops = collections.Counter()
    for r in data:
        op = r[ix["Source"]].strip().split()[0] if r[ix["Source"]].strip() else "?"
        if op.startswith("@"): op = r[ix["Source"]].strip().split()[1]
        ops[op.split(".")[0]] += float(r[ix["Instructions Executed"]] or 0)
    stalls = collections.Counter()
    for h in hdr:
        if h.startswith("stall_") and "Not Issued" not in h:
            stalls[h] = sum(float(r[ix[h]] or 0) for r in data)
    print(f"== {f}: warp instr {tot_inst/1e6:.1f} M, samples {tot_samp:.0f}")
    print("  ops:", ", ".join(f"{k} {v/1e6:.1f}M" for k,v in ops.most_common(14)))
    print("  stalls:", ", ".join(f"{k[6:]} {v/tot_samp*100:.0f}%" for k,v in stalls.most_common(8)))
