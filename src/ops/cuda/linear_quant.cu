// ops::linear on CUDA for block-quantized weights (LinearWeight::quantized(): FP8 e4m3 or FP4
// e2m1 codes with their block scales, read in place): the rows of x are quantized per 1 x 128
// block (e4m3, scale amax / 448) and multiplied with the weight blocks on the CUDA cores, fp32
// sums per block with both scales applied per block, then the bias and one rounding to act:
// include/moex/quant.hpp's math, the same as the host's src/cpu/quant_linear.cpp. Decode-sized
// calls stream the weight through the quantized GEMV; larger ones run on Hopper's FP8 tensor
// cores (the experts' FP8 wgmma kernel with the weight as one expert: FP8 weights, bf16 / f16
// activations, K a multiple of 16, aligned tensors), else through 32 x 32 CUDA-core tiles
// (src/cuda/quant_gemm.cuh).
//
// Why not cuBLASLt's block-scaled FP8 matmul: it quantizes nothing itself and wants the scales
// in its own layouts; the experts' kernel already takes 1 x 128 activation and 128 x 128 weight
// scales and promotes each K block as the block-scaled math asks.
#include "cuda/experts_ops.hpp"
#include "cuda/launchers.hpp"
#include "cuda/runtime.hpp"
#include "moex/error.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace moex::ops::cuda {

namespace {
moex::cuda::Elem elem_of(DType t) {
  switch (t) {
    case DType::kF32: return moex::cuda::Elem::kF32;
    case DType::kF16: return moex::cuda::Elem::kF16;
    case DType::kBF16: return moex::cuda::Elem::kBF16;
    default:
      throw Unsupported("quantized linear on CUDA: activations must be float32, float16 or bfloat16, not " +
                        std::string(dtype_name(t)));
  }
}
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
}  // namespace

bool linear_quantized_on_tensor_cores(int64_t rows, const LinearWeight& w, DType act, int device) {
  if (rows <= moex::cuda::kQuantLinearGemvMaxRows) return false;  // (the GEMV's)
  if (w.quant.kind != QuantScheme::Kind::kFp8E4M3 || w.quant.block_n != 128 ||
      w.quant.block_k != 128)
    return false;
  if ((act != DType::kBF16 && act != DType::kF16) || w.in % 16 != 0 || !aligned16(w.tensor.raw()))
    return false;
  return moex::cuda::traits_of(device).hopper();
}

Tensor linear_quantized(const Tensor& x, const LinearWeight& w, const Tensor& bias, DType act) {
  moex::cuda::DeviceGuard guard(x.device().index);
  const int64_t rows = x.size(0), in = w.in, out = w.out;
  if (x.size(1) != in)
    throw InvalidInput("quantized linear: x has " + std::to_string(x.size(1)) + " columns, the weight " +
                       std::to_string(in));
  if (in > (int64_t(1) << 30) || out > (int64_t(1) << 30) || rows > (int64_t(1) << 30))
    throw Unsupported("quantized linear on CUDA: sizes below 2^30");
  const moex::cuda::Elem elem = elem_of(act);
  Tensor y = Tensor::empty({rows, out}, act, x.device());
  if (rows == 0 || out == 0) return y;
  const Tensor xa = convert(x.contiguous(), act);
  const Tensor b = bias.defined() ? convert(bias, act) : Tensor();
  Tensor codes = Tensor::empty({rows, in}, DType::kU8, x.device());
  Tensor scales = Tensor::empty({rows, (in + 127) / 128}, DType::kF32, x.device());
  moex::cuda::QuantWeightArgs qw;
  qw.fp4 = w.quant.kind == QuantScheme::Kind::kFp4E2M1;
  qw.scale_e8m0 = w.scale.dtype() == DType::kF8E8M0;
  qw.scale = w.scale.raw();
  qw.block_n = int(w.quant.block_n);
  cudaStream_t s = moex::cuda::current_stream();
  if (linear_quantized_on_tensor_cores(rows, w, act, x.device().index) && aligned16(xa.raw())) {
    // (scales by K block, [ceil(in/128), rows]: the wgmma kernel's layout, same size)
    static_assert(sizeof(moex::cuda::Tile) == 4 * sizeof(int32_t));
    constexpr int64_t kTileRows = moex::cuda::kLinearWgmmaTileRows;
    Tensor tiles = Tensor::empty({(rows + kTileRows - 1) / kTileRows, 4}, DType::kI32, x.device());
    Tensor num_tiles = Tensor::empty({1}, DType::kI32, x.device());
    moex::cuda::launch_linear_quant_wgmma(
        xa.raw(), elem, rows, int(in), int(out), w.tensor.raw(), qw,
        b.defined() ? b.raw() : nullptr, y.raw(), codes.data<uint8_t>(), scales.data<float>(),
        reinterpret_cast<moex::cuda::Tile*>(tiles.data<int32_t>()), num_tiles.data<int32_t>(), s);
    return y;
  }
  moex::cuda::launch_quantize_act(xa.raw(), elem, rows, int(in), nullptr, codes.data<uint8_t>(),
                                  scales.data<float>(), s);
  moex::cuda::launch_linear_quant(codes.data<uint8_t>(), scales.data<float>(), rows, int(in), int(out),
                                  w.tensor.raw(), qw, b.defined() ? b.raw() : nullptr, elem, y.raw(), s);
  return y;
}

}  // namespace moex::ops::cuda
