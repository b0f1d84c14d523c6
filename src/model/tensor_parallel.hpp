// Tensor parallelism of the attention and dense layers (LoadOptions::tp_comm), Megatron-style as
// transformers' tp plans: a "column-parallel" linear keeps a contiguous share of its output rows
// (q / k / v by heads, gate / up by intermediate columns), the following "row-parallel" linear
// keeps the matching share of its input columns (o_proj, down), and the ranks' partial outputs
// are summed (Communicator::all_reduce_sum), so every rank holds the whole hidden state between
// layers. This file says which share a rank loads; the loaders cut it from the checkpoint
// (quantized weights at their 128-blocks), the architectures place the sums.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "moex/error.hpp"

namespace moex::model {

struct TpSplit {
  enum class Dim : unsigned char {
    kNone,  // the whole weight
    kOut,   // output rows [begin, end): column parallel (its bias is cut the same way)
    kIn,    // input columns [begin, end): row parallel (its bias is added by rank 0 alone)
  } dim = Dim::kNone;
  int parts = 1, index = 0;
  // Split in whole units of this many rows / columns (a head's width), so that a share never
  // cuts a head.
  int64_t unit = 1;

  TpSplit along(Dim d, int64_t u = 1) const {
    TpSplit s = *this;
    s.dim = parts > 1 ? d : Dim::kNone;
    s.unit = u;
    return s;
  }
  bool active() const { return dim != Dim::kNone && parts > 1; }
  // [begin, end) of a dimension of `size`; InvalidInput naming `what` unless size / unit
  // divides into `parts` equal shares.
  std::pair<int64_t, int64_t> range(int64_t size, const std::string& what) const {
    if (unit < 1 || size % unit != 0 || (size / unit) % parts != 0)
      throw InvalidInput("tensor parallelism: " + what + " (" + std::to_string(size / std::max<int64_t>(unit, 1)) +
                         (unit > 1 ? " heads of " + std::to_string(unit) : std::string()) +
                         ") does not split into --tp-size " + std::to_string(parts) + " equal shares");
    const int64_t share = size / parts;
    return {share * index, share * (index + 1)};
  }
};

}  // namespace moex::model
