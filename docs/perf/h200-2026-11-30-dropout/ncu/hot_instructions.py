import csv, sys
rows = list(csv.reader(open(sys.argv[1]))); hdr = rows[1]; data = rows[2:]
ix = {h:i for i,h in enumerate(hdr)}
key = sys.argv[2] if len(sys.argv) > 2 else "Warp Stall Sampling (All Samples)"
tot = sum(float(r[ix[key]] or 0) for r in data)
top = sorted(range(len(data)), key=lambda i: -float(data[i][ix[key]] or 0))[:12]
for i in sorted(top):
    r = data[i]
    print(f"{i:5d} {float(r[ix[key]] or 0)/tot*100:5.1f}% {r[ix['Source']][:90]}")
    # the instruction that produced the scoreboard: show 3 previous
