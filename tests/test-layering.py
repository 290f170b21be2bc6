#!/usr/bin/env python3
"""test-layering.py - the source tree's rooms stay layered (docs/ARCHITECTURE.md).

1. No circle of includes between the folders of src/: the graph whose nodes
   are folders (model, predict, placement, flash, codelets, graph) and whose
   edges are `#include "folder/x.h"` from a file of another folder has no
   cycle.
2. Pure kernels know nothing of StarPU: no file of src/model, src/predict,
   src/placement, src/flash, and none of the kernel files of src/codelets
   (ffn_sparse, ops, the CUDA kernels), includes <starpu.h> or a header that
   does (codelets/state.h, codelets/codelets.h, graph/...).
3. Kernels do not call back into their callers: the kernel tables
   (src/model/quants_scalar.c, quants_avx2*.c) include none of the headers
   of the files that choose and call them (quants_dispatch.h, kernels.h),
   and the SIMD ones not quants.h either.
Prints what it checked; exits 1 on a violation.
"""
import os, re, sys

src = os.path.join(os.environ.get("srcdir", "."), "src")
inc_re = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)
files = {}
for d, _, names in os.walk(src):
    for n in names:
        if n.endswith((".c", ".h", ".cu", ".cuh")):
            p = os.path.join(d, n)
            rel = os.path.relpath(p, src)
            files[rel] = [(k, h) for k, h in inc_re.findall(open(p, encoding="utf-8").read())]

failures = []
# 1. folder graph
edges = {}
for rel, incs in files.items():
    a = rel.split(os.sep)[0] if os.sep in rel else None
    if a is None:
        continue
    for k, h in incs:
        if k == '"' and "/" in h:
            b = h.split("/")[0]
            if b != a and os.path.isdir(os.path.join(src, b)):
                edges.setdefault(a, {}).setdefault(b, rel + " -> " + h)
state = {}
def visit(n, path):
    state[n] = 1
    for m in sorted(edges.get(n, {})):
        if state.get(m) == 1:
            cyc = path[path.index(m):] + [m] if m in path else [n, m]
            failures.append("include circle between folders: " + " -> ".join(cyc) + " (" +
                            "; ".join(edges[x][y] for x, y in zip(cyc, cyc[1:]) if y in edges.get(x, {})) + ")")
        elif state.get(m) is None:
            visit(m, path + [m])
    state[n] = 2
for n in sorted(edges):
    if state.get(n) is None:
        visit(n, [n])
print("folders:", ", ".join("%s -> {%s}" % (a, ", ".join(sorted(b))) for a, b in sorted(edges.items())))

# 2. StarPU in pure kernels (transitively through project headers)
def includes_starpu(rel, seen=None):
    seen = seen or set()
    if rel in seen or rel not in files:
        return False
    seen.add(rel)
    for k, h in files[rel]:
        if k == "<" and h == "starpu.h":
            return True
        if k == '"' and includes_starpu(h, seen):
            return True
    return False
pure = [r for r in files if r.split(os.sep)[0] in ("model", "predict", "placement", "flash")]
pure += [r for r in files if r.startswith("codelets" + os.sep) and
         (os.path.basename(r).startswith(("ffn_sparse.", "ops.", "codelets_cuda.", "cuda_common.")) or
          r.endswith(".cu"))]
for r in sorted(pure):
    if includes_starpu(r):
        failures.append("a pure kernel file knows StarPU: " + r)
print("pure kernel files without StarPU:", len(pure))

# 3. the SIMD tables do not include their callers
for r in sorted(files):
    rr = r.replace(os.sep, "/")
    callers = None
    if re.match(r"model/quants_avx2.*\.c$", rr):
        callers = ("model/quants.h", "model/kernels.h", "model/quants_dispatch.h")
    elif rr == "model/quants_scalar.c":
        callers = ("model/kernels.h", "model/quants_dispatch.h")
    for k, h in files[r] if callers else []:
        if h in callers:
            failures.append("%s includes its caller's header %s" % (r, h))

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
