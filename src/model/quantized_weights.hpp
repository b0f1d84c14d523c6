// Block-quantized checkpoints (config `quantization_config`, quant_method "fp8"): reading the
// config, validating a quantized weight against its scales, and either keeping it quantized
// (ops::LinearWeight's quantized form, ExpertsWeights with spec.quant) or dequantizing it to the
// compute dtype at load (LoadOptions::dequantize). Architecture-independent: every loader of
// layers.hpp takes a QuantLoad and goes by the tensors present (a weight with a
// `weight_scale_inv` sibling is quantized; any other is plain).
//
// Formats (include/moex/quant.hpp has the math):
// - FP8: `<name>.weight` F8_E4M3 [N, K] + `<name>.weight_scale_inv` [ceil(N/128), ceil(K/128)],
//   F32 or F8_E8M0 (either is accepted whatever scale_fmt says: hub checkpoints with
//   scale_fmt "ue8m0" also ship power-of-two F32 scales).
// - FP4 (routed experts when config `expert_dtype` is "fp4"): I8 [N, K/2], two e2m1 codes per
//   byte (low nibble = even column), scales F8_E8M0 [N, ceil(K/32)].
// Errors: Unsupported for a method / fmt / scale_fmt / expert_dtype / block size / activation
// scheme moex does not run; InvalidInput (naming the file, key or tensor, expected vs actual)
// for inconsistent configs and tensors.
#pragma once

#include <cstdint>
#include <string>

#include "moex/checkpoint.hpp"
#include "moex/experts.hpp"
#include "model/tensor_parallel.hpp"
#include "moex/tensor.hpp"
#include "ops/ops.hpp"

namespace moex::model {

struct QuantLoad {
  bool quantized = false;     // the checkpoint has a quantization_config
  bool dequantize = false;    // convert every quantized weight to the compute dtype at load
  bool fp4_experts = false;   // config expert_dtype "fp4"
  std::string scale_fmt;      // "float" or "ue8m0" (for reports)
  std::string where;          // "DIR/config.json"
};

// Reads and validates `quantization_config` / `expert_dtype` of ckpt's config.json (a
// checkpoint without one gives quantized = false). Also rejects `weight_scale_inv` tensors in a
// checkpoint whose config has no quantization_config (they would be read without their scales).
QuantLoad parse_quant_load(const Checkpoint& ckpt, bool dequantize);

// Whether `<name>.weight` is stored quantized (has a `weight_scale_inv` sibling).
bool is_quantized_weight(const Checkpoint& ckpt, const std::string& name);

// A quantized weight as read from the checkpoint (views of the mapping), validated.
struct QuantizedTensor {
  Tensor codes;   // FP8: kF8E4M3 [N, K]; FP4: kI8 [N, K / 2]
  Tensor scale;   // see the top of this file
  QuantScheme scheme;
  int64_t n = 0, k = 0;
};
// Reads `<name>.weight` + `<name>.weight_scale_inv` of logical shape [n, k]; `fp4` says which
// format is expected. Throws as documented above.
QuantizedTensor read_quantized(const Checkpoint& ckpt, const std::string& name, int64_t n, int64_t k,
                               bool fp4);

// W_real = value x scale in float32 per quant.hpp, rounded once to `dtype` (exact for float32).
// -> host [n, k].
Tensor dequantize(const QuantizedTensor& q, DType dtype);
// The quantized weight `<name>.weight` [n, k] (FP8, or FP4 when stored as I8) read and
// dequantized to `dtype`. -> host [n, k].
Tensor read_dequantized(const Checkpoint& ckpt, const std::string& name, int64_t n, int64_t k, DType dtype);

// The weight of linear `<name>` [out, in] prepared for `device`: quantized as stored (unless
// quant.dequantize) when it has a scale, else the plain path (converted to `dtype`).
// keep_tensor as for ops::prepare_linear (plain / dequantized weights only).
// `tp`: only this rank's share (tensor_parallel.hpp), cut on the host before it moves to `device`;
// a quantized weight kept quantized is cut with its scales, which needs the share's bounds on the
// scale blocks (FP8: 128 rows / columns; InvalidInput otherwise, suggesting --dequantize).
ops::LinearWeight load_linear_weight(const Checkpoint& ckpt, const std::string& name, int64_t out,
                                     int64_t in, DType dtype, Device device, bool keep_tensor,
                                     const QuantLoad& quant, const TpSplit& tp = {});

}  // namespace moex::model
