#!/usr/bin/env python3
"""Prints the wgmma wrapper functions of src/cuda/hopper.cuh (one asm statement per shape and
type: 64 or 128 fp32 accumulator registers per thread cannot be passed as an array operand).
Usage: python3 tools/gen_wgmma_wrappers.py  (paste the output between the markers in hopper.cuh)."""


def wrapper(n, ty):
    regs = n // 2
    lines = [f"__device__ __forceinline__ void wgmma_m64n{n}k16_{ty}(float* d, uint64_t da, uint64_t db) {{",
             "  asm volatile(",
             '      "{\\n.reg .pred p;\\nsetp.ne.b32 p, %' + str(regs + 2) + ', 0;\\n"',
             f'      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} "']
    chunks = [list(range(i, min(i + 16, regs))) for i in range(0, regs, 16)]
    for ci, c in enumerate(chunks):
        body = ", ".join(f"%{i}" for i in c)
        lines.append(f'      "{"{" if ci == 0 else ""}{body}{"}, " if ci == len(chunks) - 1 else ", "}"')
    lines.append(f'      "%{regs}, %{regs + 1}, p, 1, 1, 0, 0;\\n}}\\n"')
    cons = [f'"+f"(d[{i}])' for i in range(regs)]
    rows = ["        " + ", ".join(cons[i:i + 8]) for i in range(0, regs, 8)]
    lines.append("      : " + ",\n".join(rows).lstrip())
    lines.append('      : "l"(da), "l"(db), "r"(1));')
    lines.append("}")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(wrapper(n, ty) for n in (128, 256) for ty in ("bf16", "f16")))
