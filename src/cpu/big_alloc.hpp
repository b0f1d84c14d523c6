// Allocation of the engine's large buffers (packed weights, workspace): 2 MiB-aligned and
// marked MADV_HUGEPAGE, so the 1 GB weight stream and the strided activation tiles (one AMX tile
// row per 4 KiB page otherwise) do not walk the page tables every 4 KiB. The machine's
// transparent huge pages are "madvise"-only, so without the hint they are never used. Small
// buffers keep ordinary 64-byte alignment. The packed expert weights opt out (huge = false):
// faulting them in as huge pages made prepare 6-7x slower on the development VM, and decode and
// prefill measured the same without (docs/cpu.md, "One copy of the experts").
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <new>

namespace moex::cpu {

constexpr size_t kHugePage = size_t(2) << 20;

// Bytes actually reserved for a request of `bytes` (callers free with the same value).
inline size_t big_alloc_size(size_t bytes) {
  return bytes >= kHugePage ? (bytes + kHugePage - 1) / kHugePage * kHugePage : (bytes ? bytes : 64);
}
// `huge`: ask for transparent huge pages (MADV_HUGEPAGE). Without it the buffer is still 2 MiB
// aligned but faults in 4 KiB pages (first touch of fresh memory on the development VM: 0.2-0.5
// GB/s in huge pages, 1.2-1.5 GB/s in 4 KiB pages).
inline void* big_alloc(size_t bytes, bool huge = true) {
  const size_t n = big_alloc_size(bytes);
  if (n < kHugePage) return ::operator new(n, std::align_val_t(64));
  void* p = ::operator new(n, std::align_val_t(kHugePage));
#ifdef MADV_HUGEPAGE
  if (huge) madvise(p, n, MADV_HUGEPAGE);  // a hint: failure only costs speed
#endif
  return p;
}
inline void big_free(void* p, size_t bytes) {
  if (!p) return;
  if (big_alloc_size(bytes) < kHugePage) ::operator delete(p, std::align_val_t(64));
  else ::operator delete(p, std::align_val_t(kHugePage));
}

}  // namespace moex::cpu
