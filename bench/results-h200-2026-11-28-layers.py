#!/usr/bin/env python3
"""Per-layer phases of one decoded token from a converted FxT trace.

Usage: results-h200-2026-11-28-layers.py DIR T0 T1
DIR holds tasks.rec (tools/trace DIR); T0:T1 is the window in ms that
DIR/trace-summary.md names.  For each layer: the attention task's start and
length (and its worker), the cold FFN slices' phase (first start to last
end, mean slice), the gap from the attention's end to the first slice, and
from the last slice to the next layer's attention.
"""
import collections
import re
import statistics
import sys


def records(path):
    cur = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                if cur:
                    yield cur
                cur = {}
                continue
            k, _, v = line.partition(": ")
            cur[k] = v
    if cur:
        yield cur


def main():
    d, w0, w1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    layers = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records(d + "/tasks.rec"):
        m = re.match(r"(attn|ffn_cold)_L(\d+)", r.get("Name", ""))
        if not m or "StartTime" not in r:
            continue
        s, e = float(r["StartTime"]), float(r["EndTime"])
        if s >= w0 and e <= w1:
            layers[int(m.group(2))][m.group(1)].append((s, e, int(r["WorkerId"])))
    print("layer  attn start   len  worker  cold start..end   phase  slice  gap1   gap2")
    ls = sorted(layers)
    for i, l in enumerate(ls):
        a, c = layers[l]["attn"], layers[l]["ffn_cold"]
        if not a or not c:
            continue
        ast, ae = min(t[0] for t in a), max(t[1] for t in a)
        cs, ce = min(t[0] for t in c), max(t[1] for t in c)
        nxt = layers[ls[i + 1]]["attn"] if i + 1 < len(ls) else []
        gap2 = min(t[0] for t in nxt) - ce if nxt else 0.0
        print(f"{l:5d}  {ast - w0:10.3f} {ae - ast:5.3f}  w{a[0][2]:<5d} {cs - w0:7.3f}..{ce - w0:7.3f}"
              f"  {ce - cs:5.3f}  {statistics.mean(t[1] - t[0] for t in c):5.3f}"
              f"  {cs - ae:5.3f}  {gap2:5.3f}")


if __name__ == "__main__":
    main()
