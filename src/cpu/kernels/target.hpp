// Target regions for the kernel files: everything between MOEX_TARGET_BEGIN("avx2,fma") and
// MOEX_TARGET_END compiles for that instruction set, templates included from inside the region
// too (gemm_loop.hpp), while the rest of the library stays baseline x86-64 and dispatches at run
// time (engine.cpp). A function-level attribute cannot do this for a template shared by several
// instruction sets: its target would have to depend on a template argument. Standard headers
// must be included before the region, or their inline functions would be compiled for the target
// and could be picked by the linker for callers on any CPU.
#pragma once

#define MOEX_TARGET_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define MOEX_TARGET_BEGIN(isa) \
  MOEX_TARGET_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define MOEX_TARGET_END MOEX_TARGET_PRAGMA(clang attribute pop)
#else
#define MOEX_TARGET_BEGIN(isa) \
  MOEX_TARGET_PRAGMA(GCC push_options) MOEX_TARGET_PRAGMA(GCC target(isa))
#define MOEX_TARGET_END MOEX_TARGET_PRAGMA(GCC pop_options)
#endif
