// Requirement checks of the DeepGEMM- and SonicMoE-style backends: see
// moex/backend_requirements.hpp. The deepgemm conditions follow transformers' deepgemm
// integration (compute capability, FP4 only on Blackwell, UE8M0 scales on Blackwell, 128 x 128
// FP8 blocks, dynamic activations), the sonicmoe ones its sonicmoe integration (CUDA, compute
// capability 9.0 or newer, gated experts, silu / gelu / relu), plus the layout limits of moex's
// own Hopper kernels.
#include "moex/backend_requirements.hpp"

namespace moex {
namespace {

std::string cc_str(const DeviceDescription& d) {
  return std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor);
}

const char* weights_kind(const ExpertsSpec& s) {
  switch (s.quant.kind) {
    case QuantScheme::Kind::kFp8E4M3: return "FP8 (e4m3)";
    case QuantScheme::Kind::kFp4E2M1: return "FP4 (e2m1)";
    case QuantScheme::Kind::kNone: break;
  }
  return "unquantized";
}

bool static_activations(const ExpertsSpec& s) {
  return s.quant.quantized() && s.quant.activations == QuantScheme::Activations::kStatic;
}

}  // namespace

std::string DeviceDescription::str() const {
  if (!cuda) return "the host (no CUDA device)";
  return (name.empty() ? std::string("a CUDA device") : name) + " (compute capability " + cc_str(*this) + ")";
}

std::string deepgemm_unsupported(const ExpertsSpec& spec, DType act, const DeviceDescription& d) {
  const bool fp8 = spec.quant.kind == QuantScheme::Kind::kFp8E4M3;
  const bool fp4 = spec.quant.kind == QuantScheme::Kind::kFp4E2M1;
  if (!d.cuda) return "needs a Hopper GPU (compute capability 9.0); this is " + d.str() + ": use grouped_mm";
  if (d.cc_major < 9)
    return "needs compute capability 9.0 (Hopper) or newer; " + d.str() +
           " has no wgmma / TMA: use grouped_mm";
  if (static_activations(spec))
    return "quantizes activations per 1 x 128 block at run time: activation_scheme 'static' is not "
           "supported, use a checkpoint with activation_scheme 'dynamic'";
  if (fp8 && (spec.quant.block_n != 128 || spec.quant.block_k != 128))
    return "needs FP8 weights in 128 x 128 blocks, got " + std::to_string(spec.quant.block_n) + " x " +
           std::to_string(spec.quant.block_k);
  if (d.cc_major >= 10) {
    if (spec.quant.quantized() && spec.quant.scale_dtype == DType::kF32)
      return "on Blackwell (" + d.str() +
             ") DeepGEMM reads UE8M0 (power-of-two) scales only, and these are float32 (scale_fmt "
             "'float'): rounding them would change the output; use a scale_fmt 'ue8m0' checkpoint, "
             "or grouped_mm, which reads float32 scales";
    return "moex builds its deepgemm kernels for Hopper (sm_90a) only, and " + d.str() +
           " is not one: use grouped_mm";
  }
  if (d.cc_major != 9 || d.cc_minor != 0)
    return "moex builds its deepgemm kernels for sm_90a (compute capability 9.0), not " + d.str() +
           ": use grouped_mm";
  if (fp4)
    return "has no Hopper kernel for FP4 (e2m1) experts (DeepGEMM runs FP4 on Blackwell only): use "
           "an FP8 checkpoint, or grouped_mm / batched_mm, which decode FP4 on the CUDA cores";
  if (act != DType::kBF16)
    return "takes bfloat16 activations, not " + std::string(dtype_name(act)) + " (load with --dtype bfloat16)";
  if (spec.is_transposed) return "takes row-major [E, N, K] expert weights, not transposed ones: use grouped_mm";
  if (spec.has_gate && !spec.is_concatenated)
    return "takes gate_up as [gate; up] halves, not interleaved gate / up rows: use grouped_mm";
  const int64_t m = fp8 ? 16 : 8;
  if (spec.hidden % m != 0 || spec.intermediate % m != 0)
    return "needs the hidden and intermediate sizes to be multiples of " + std::to_string(m) +
           " (TMA rows of 16 bytes), got H = " + std::to_string(spec.hidden) +
           ", I = " + std::to_string(spec.intermediate) + ": use grouped_mm";
  return {};
}

std::string sonicmoe_unsupported(const ExpertsSpec& spec, DType act, const DeviceDescription& d) {
  if (!d.cuda) return "needs a Hopper GPU (compute capability 9.0); this is " + d.str() + ": use grouped_mm";
  if (d.cc_major < 9)
    return "needs compute capability 9.0 (Hopper) or newer; " + d.str() +
           " has no wgmma / TMA: use grouped_mm";
  if (d.cc_major != 9 || d.cc_minor != 0)
    return "moex builds its sonicmoe kernels for sm_90a (compute capability 9.0), not " + d.str() +
           ": use grouped_mm";
  if (!spec.has_gate)
    return "fuses a gated MLP (SwiGLU / GeGLU / ReGLU) and these experts have no gate: use grouped_mm";
  if (spec.act != Activation::kSilu && spec.act != Activation::kGelu && spec.act != Activation::kRelu)
    return "supports the gated activations silu, gelu and relu (SwiGLU, GeGLU, ReGLU), not " +
           std::string(activation_name(spec.act)) +
           (spec.act == Activation::kSwigluOai ? " (gpt-oss's clamped SwiGLU)" : "") + ": use grouped_mm";
  if (spec.quant.quantized())
    return std::string("runs bf16 / f16 experts, not ") + weights_kind(spec) +
           " ones: use deepgemm (FP8) or grouped_mm, or load with --dequantize";
  if (act != DType::kBF16 && act != DType::kF16)
    return "takes bfloat16 or float16 activations, not " + std::string(dtype_name(act)) +
           " (load with --dtype bfloat16)";
  if (spec.is_transposed) return "takes row-major [E, N, K] expert weights, not transposed ones: use grouped_mm";
  if (!spec.is_concatenated)
    return "takes gate_up as [gate; up] halves, not interleaved gate / up rows: use grouped_mm";
  if (spec.hidden % 8 != 0 || spec.intermediate % 8 != 0)
    return "needs the hidden and intermediate sizes to be multiples of 8 (rows of 16-byte loads), got H = " +
           std::to_string(spec.hidden) + ", I = " + std::to_string(spec.intermediate) + ": use grouped_mm";
  return {};
}

std::string deepgemm_megamoe_unsupported(const ExpertsSpec& spec, DType act, const DeviceDescription& d,
                                         int ep_size) {
  (void)act;
  if (!d.cuda || d.cc_major < 10)
    return "needs a Blackwell GPU (compute capability 10.0 or newer); this is " + d.str() +
           (d.cuda && d.cc_major == 9 ? ": on Hopper use deepgemm (FP8 experts) or grouped_mm"
                                      : ": use grouped_mm");
  if (spec.quant.kind != QuantScheme::Kind::kFp4E2M1)
    return std::string("needs FP4 (e2m1) experts with UE8M0 scales; these experts are ") + weights_kind(spec) +
           (spec.quant.kind == QuantScheme::Kind::kFp8E4M3 ? ": use deepgemm for FP8 experts" : ": use grouped_mm");
  if (spec.quant.scale_dtype != DType::kF8E8M0)
    return "needs UE8M0 (power-of-two) scales, and these are float32: rounding them would change "
           "the output; use a scale_fmt 'ue8m0' checkpoint";
  if (static_activations(spec))
    return "quantizes activations at run time: activation_scheme 'static' is not supported, use 'dynamic'";
  if (ep_size < 2)
    return "fuses the expert-parallel dispatch and combine, so it needs an expert-parallel group "
           "(ep_size >= 2); this run has none: use grouped_mm";
  return "moex has no build of the fused Mega MoE kernel for " + d.str() + ": use grouped_mm";
}

}  // namespace moex
