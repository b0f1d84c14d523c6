// Comparing a result with a reference: the one error metric and tolerance rule that the tests,
// the benchmarks and the model checks share.
#pragma once

#include <cstdint>

#include "moex/tensor.hpp"

namespace moex {

// ||out - ref|| / ||ref|| computed in double over all elements (any float dtypes, any device);
// +inf when out holds a NaN or Inf or the element counts differ; ||out|| when ref is all zero.
double rel_l2_error(const Tensor& out, const Tensor& ref);

// Tolerance for rel_l2_error of an experts result against the float64 reference:
// c x (unit roundoff of the dtype) + 8 x sqrt(reduction_length) x 2^-24, with unit roundoff
// float32 2^-24, float16 2^-11, bfloat16 2^-8 and c = 3 for the 16-bit dtypes (the intermediate
// and the output are rounded once each, at most u each; the third u is room for cancellation
// between a token's k contributions), c = 8 for float32; fp32 accumulation errors grow like a
// random walk. The derivation and measurements are in src/core/check.cpp. Not loose: a single
// weight moved by the largest weight magnitude fails it in float32, float16 and bfloat16 (the
// harness self-tests in tests/test_experts_consistency.cpp).
double experts_tolerance(DType dtype, int64_t reduction_length);

}  // namespace moex
