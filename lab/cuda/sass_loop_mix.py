#!/usr/bin/env python3
"""Instructions per iteration of a kernel's loops, by opcode, from its SASS.

Counts the instructions between each backward branch and its target (a loop body as the
compiler laid it out) in the SASS of one kernel. For a kernel bound by its instruction issue
(the FP4 GEMVs, docs/cuda.md) this is the number that a change to its inner loop moves, and it
needs no GPU: cuobjdump disassembles the object built here.

    python3 lab/cuda/sass_loop_mix.py build/CMakeFiles/moex.dir/src/cuda/quant_gemm.cu.o \
        gemv_fp4_mma_kernelI13__nv_bfloat16Li0ELi2E

The second argument is a substring of the mangled kernel name (`cuobjdump -sass OBJ | grep
Function` lists them). cuobjdump and nvdisasm come with the CUDA toolkit (or the PyPI wheels
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm). Loops shorter than --min instructions (the
staging and epilogue loops) are left out.
"""
import argparse
import collections
import re
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("obj", help="object file or binary with sm_90 SASS")
    ap.add_argument("kernel", help="substring of the mangled kernel name")
    ap.add_argument("--min", type=int, default=50, help="smallest loop body reported")
    a = ap.parse_args()
    names = [l.split(":", 1)[1].strip() for l in subprocess.run(
        ["cuobjdump", "-sass", a.obj], capture_output=True, text=True, check=True).stdout.splitlines()
        if "Function :" in l and a.kernel in l]
    if not names:
        sys.exit(f"no kernel matching {a.kernel!r} in {a.obj}")
    for name in names:
        sass = subprocess.run(["cuobjdump", "-sass", "-fun", name, a.obj], capture_output=True,
                              text=True, check=True).stdout.splitlines()
        ins = []
        for l in sass:
            m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)(\S*)(.*)", l)
            if m:
                ins.append((int(m.group(1), 16), m.group(3), m.group(5)))
        print(name)
        for addr, op, rest in ins:
            b = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
            if not b:
                continue
            dst = int(b.group(1), 16)
            body = [o for (x, o, _) in ins if dst <= x <= addr]
            if dst < addr and len(body) >= a.min:
                mix = collections.Counter(body).most_common(16)
                print(f"  loop {dst:#x}..{addr:#x}: {len(body)} instructions: " +
                      " ".join(f"{o} {n}" for o, n in mix))


if __name__ == "__main__":
    main()
