// A replay of the selection the host's ops::torch_topk performs (src/ops/cpu/routing.cpp), for the
// CUDA routers (src/ops/cuda/routing.cu).
//
// Why a replay: torch's CPU topk, and so the host's torch_topk, runs libstdc++'s
// std::partial_sort / std::nth_element / std::sort on (value, index) pairs comparing values
// only. Which of several equal values wins, and the slot order of the winners, is a consequence of
// exactly how those algorithms move elements (heap sift order, median-of-three pivots, unguarded
// partitions, insertion sorts). bf16 router logits tie all the time and the chosen expert decides
// a layer's output, so the device replays the same element movements: the functions below
// re-implement libstdc++'s (GCC 12) algorithms step for step, with the same comparisons in the
// same order and the same moves, on pairs in memory the caller owns (shared memory on the
// device), run by one thread. Only the order relation of the values matters to them, so device
// values need only compare like the host's, not match them bit for bit.
//
// Host and device code alike (no CUDA headers needed), so that tests/test_cuda_ops.cpp checks the
// replay against libstdc++ itself on every build, GPU or not.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MOEX_HD __host__ __device__
#else
#define MOEX_HD
#endif

namespace moex::ops::cuda::topk_replay {

struct Elem {
  float v;
  int i;
};

// torch's topk comparator: larger values first, NaN largest.
MOEX_HD inline bool larger(const Elem& x, const Elem& y) {
  const bool x_nan = x.v != x.v, y_nan = y.v != y.v;  // isnan without <cmath> on either side
  return (x_nan && !y_nan) || x.v > y.v;
}
MOEX_HD inline void swap_at(Elem* a, int x, int y) {
  const Elem t = a[x];
  a[x] = a[y];
  a[y] = t;
}
// floor(log2(n)), n > 0: the depth limit's base (std::__lg).
MOEX_HD inline int lg(int n) {
#ifdef __CUDA_ARCH__
  return 31 - __clz(n);
#else
  return 31 - __builtin_clz(unsigned(n));
#endif
}

// -- heaps (stl_heap.h). "Max"-heap under `larger`: a[0] is the element that compares last.

MOEX_HD inline void push_heap(Elem* a, int hole, int top, Elem value) {
  int parent = (hole - 1) / 2;
  while (hole > top && larger(a[parent], value)) {
    a[hole] = a[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  a[hole] = value;
}

// Sifts the hole at `hole` down to a leaf, always taking the child that compares later (the
// second child on ties), then pushes `value` back up: libstdc++'s __adjust_heap.
MOEX_HD inline void adjust_heap(Elem* a, int hole, int len, Elem value) {
  const int top = hole;
  int second = hole;
  while (second < (len - 1) / 2) {
    second = 2 * (second + 1);
    if (larger(a[second], a[second - 1])) --second;
    a[hole] = a[second];
    hole = second;
  }
  if ((len & 1) == 0 && second == (len - 2) / 2) {
    second = 2 * (second + 1);
    a[hole] = a[second - 1];
    hole = second - 1;
  }
  push_heap(a, hole, top, value);
}

MOEX_HD inline void make_heap(Elem* a, int len) {
  if (len < 2) return;
  for (int parent = (len - 2) / 2;; --parent) {
    adjust_heap(a, parent, len, a[parent]);
    if (parent == 0) return;
  }
}

// Moves the heap top [0, len) to `result` and re-heaps with the element that was there.
MOEX_HD inline void pop_heap(Elem* a, int len, int result) {
  const Elem value = a[result];
  a[result] = a[0];
  adjust_heap(a, 0, len, value);
}

MOEX_HD inline void heap_select(Elem* a, int middle, int last) {
  make_heap(a, middle);
  for (int i = middle; i < last; ++i)
    if (larger(a[i], a[0])) pop_heap(a, middle, i);
}

MOEX_HD inline void sort_heap(Elem* a, int len) {
  while (len > 1) {
    --len;
    pop_heap(a, len, len);
  }
}

MOEX_HD inline void partial_sort(Elem* a, int middle, int last) {
  heap_select(a, middle, last);
  sort_heap(a, middle);
}

// -- quicksort pieces (stl_algo.h)

MOEX_HD inline void move_median_to_first(Elem* a, int result, int x, int y, int z) {
  if (larger(a[x], a[y])) {
    if (larger(a[y], a[z])) swap_at(a, result, y);
    else if (larger(a[x], a[z])) swap_at(a, result, z);
    else swap_at(a, result, x);
  } else if (larger(a[x], a[z])) {
    swap_at(a, result, x);
  } else if (larger(a[y], a[z])) {
    swap_at(a, result, z);
  } else {
    swap_at(a, result, y);
  }
}

// The pivot stays at `pivot` (outside [first, last)); the median-of-three leaves sentinels on
// both sides, so neither scan leaves the range.
MOEX_HD inline int unguarded_partition(Elem* a, int first, int last, int pivot) {
  while (true) {
    while (larger(a[first], a[pivot])) ++first;
    --last;
    while (larger(a[pivot], a[last])) --last;
    if (!(first < last)) return first;
    swap_at(a, first, last);
    ++first;
  }
}

MOEX_HD inline int unguarded_partition_pivot(Elem* a, int first, int last) {
  const int mid = first + (last - first) / 2;
  move_median_to_first(a, first, first + 1, mid, last - 1);
  return unguarded_partition(a, first + 1, last, first);
}

MOEX_HD inline void unguarded_linear_insert(Elem* a, int last) {
  const Elem val = a[last];
  int next = last - 1;
  while (larger(val, a[next])) {
    a[last] = a[next];
    last = next;
    --next;
  }
  a[last] = val;
}

MOEX_HD inline void insertion_sort(Elem* a, int first, int last) {
  if (first == last) return;
  for (int i = first + 1; i != last; ++i) {
    if (larger(a[i], a[first])) {
      const Elem val = a[i];
      for (int j = i; j > first; --j) a[j] = a[j - 1];
      a[first] = val;
    } else {
      unguarded_linear_insert(a, i);
    }
  }
}

constexpr int kSortThreshold = 16;  // libstdc++'s _S_threshold

MOEX_HD inline void final_insertion_sort(Elem* a, int first, int last) {
  if (last - first > kSortThreshold) {
    insertion_sort(a, first, first + kSortThreshold);
    for (int i = first + kSortThreshold; i != last; ++i) unguarded_linear_insert(a, i);
  } else {
    insertion_sort(a, first, last);
  }
}

// Pending ranges of the introsort: libstdc++ recurses into [cut, last) and loops on
// [first, cut). The ranges are disjoint and each one's treatment depends only on its contents
// and depth budget, so an explicit stack visiting them in another order moves the same elements
// the same way. Pushed depths strictly decrease from the bottom of the stack up (each push is one
// below the range being split, which is below everything under it), so 2 * lg(n) entries suffice.
constexpr int kMaxElems = 8192;
constexpr int kStack = 32;
static_assert(2 * 13 <= kStack && (1 << 13) == kMaxElems, "introsort stack too small");

MOEX_HD inline void introsort(Elem* a, int first, int last, unsigned long long* stack) {
  if (first == last) return;
  int sp = 0;
  auto push = [&](int f, int l, int d) {
    stack[sp++] = (unsigned long long)f | ((unsigned long long)l << 21) | ((unsigned long long)d << 42);
  };
  push(first, last, 2 * lg(last - first));
  while (sp > 0) {
    const unsigned long long e = stack[--sp];
    const int f = int(e & 0x1fffff);
    int l = int((e >> 21) & 0x1fffff), d = int(e >> 42);
    while (l - f > kSortThreshold) {
      if (d == 0) {
        partial_sort(a + f, l - f, l - f);  // heap sort of the range
        break;
      }
      --d;
      const int cut = unguarded_partition_pivot(a, f, l);
      push(cut, l, d);
      l = cut;
    }
  }
  final_insertion_sort(a, first, last);
}

MOEX_HD inline void introselect(Elem* a, int first, int nth, int last) {
  int depth = 2 * lg(last - first);
  while (last - first > 3) {
    if (depth == 0) {
      heap_select(a + first, nth + 1 - first, last - first);
      swap_at(a, first, nth);  // the nth element to its final place
      return;
    }
    --depth;
    const int cut = unguarded_partition_pivot(a, first, last);
    if (cut <= nth) first = cut;
    else last = cut;
  }
  insertion_sort(a, first, last);
}

// ops::torch_topk on a[0, n) in place (n <= kMaxElems): the chosen pairs end up in a[0, k), in
// the host's slot order. `stack`: kStack scratch words.
MOEX_HD inline void torch_topk(Elem* a, int n, int k, bool sorted, unsigned long long* stack) {
  if (int64_t(k) * 64 <= n) {
    partial_sort(a, k, n);
  } else {
    if (k - 1 < n) introselect(a, 0, k - 1, n);  // std::nth_element returns at once for nth == last
    if (sorted) introsort(a, 0, k - 1, stack);
  }
}

}  // namespace moex::ops::cuda::topk_replay
