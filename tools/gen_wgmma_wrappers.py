#!/usr/bin/env python3
"""Prints the wgmma wrapper functions of src/cuda/hopper.cuh (one asm statement per shape and
type: 64 or 128 fp32 accumulator registers per thread cannot be passed as an array operand).
bf16 / f16: k16, always accumulating (D += A B), both operands K-major (transpose flags 0).
e4m3: k32 (FP8 takes no transpose flags: both operands must be K-major), and a run-time
scale_d (0: D = A B, which starts a block's partial sum without zeroing the registers).
Usage: python3 tools/gen_wgmma_wrappers.py [e4m3]  (paste the output into hopper.cuh)."""


def wrapper(n, ty):
    regs = n // 2
    fp8 = ty == "e4m3"
    k = 32 if fp8 else 16
    args = "float* d, uint64_t da, uint64_t db" + (", int scale_d" if fp8 else "")
    lines = [f"__device__ __forceinline__ void wgmma_m64n{n}k{k}_{ty}({args}) {{",
             "  asm volatile(",
             '      "{\\n.reg .pred p;\\nsetp.ne.b32 p, %' + str(regs + 2) + ', 0;\\n"',
             f'      "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ty}.{ty} "']
    chunks = [list(range(i, min(i + 16, regs))) for i in range(0, regs, 16)]
    for ci, c in enumerate(chunks):
        body = ", ".join(f"%{i}" for i in c)
        lines.append(f'      "{"{" if ci == 0 else ""}{body}{"}, " if ci == len(chunks) - 1 else ", "}"')
    tail = "p, 1, 1" if fp8 else "p, 1, 1, 0, 0"
    lines.append(f'      "%{regs}, %{regs + 1}, {tail};\\n}}\\n"')
    cons = [f'"+f"(d[{i}])' for i in range(regs)]
    rows = ["        " + ", ".join(cons[i:i + 8]) for i in range(0, regs, 8)]
    lines.append("      : " + ",\n".join(rows).lstrip())
    lines.append('      : "l"(da), "l"(db), "r"(' + ("scale_d" if fp8 else "1") + "));")
    lines.append("}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["e4m3"]:
        print(wrapper(128, "e4m3"))
    else:
        print("\n\n".join(wrapper(n, ty) for n in (128, 256) for ty in ("bf16", "f16")))
