// Comparing a result with a reference: the one error metric and tolerance rule that the tests,
// the benchmarks and the model checks share.
#pragma once

#include <cstdint>

#include "moex/tensor.hpp"

namespace moex {

// ||out - ref|| / ||ref|| computed in double over all elements (any float dtypes, any device);
// +inf when out holds a NaN or Inf or the element counts differ; ||out|| when ref is all zero.
double rel_l2_error(const Tensor& out, const Tensor& ref);

// Tolerance for rel_l2_error of an experts result against the float64 reference: 8 x (unit
// roundoff of the dtype + sqrt(reduction_length) x 2^-24). Unit roundoff: float32 2^-24,
// float16 2^-11, bfloat16 2^-8 (operands, the intermediate and the output are rounded once each;
// fp32 accumulation errors grow like a random walk). Tests show it is not loose: a single
// perturbed weight fails it.
double experts_tolerance(DType dtype, int64_t reduction_length);

}  // namespace moex
