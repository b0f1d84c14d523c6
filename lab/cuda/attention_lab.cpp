// moex's CUDA attention op (ops::attention through the dispatch) timed on model shapes, to weigh
// it against torch's sdpa backends (flash, cuDNN) timed by attention_torch.py on the same shapes
// in the same run (lab/cuda/attention_compare.sh). Prints one JSON line per case.
//
// Build (from the repository root, after a CUDA build in build/):
//   g++ -std=c++20 -O2 -Iinclude -Isrc -I/usr/local/cuda/include lab/cuda/attention_lab.cpp -Lbuild -lmoex -Wl,-rpath,$PWD/build -o build/attention_lab
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/runtime.hpp"
#include "moex/bench.hpp"
#include "ops/cuda/attention_cudnn.hpp"
#include "ops/cuda/attention_plan.hpp"
#include "ops/ops.hpp"

using namespace moex;

namespace {

Tensor random_device(int64_t rows, int64_t width, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(size_t(rows * width));
  for (auto& x : v) x = d(rng);
  return Tensor::from_floats(v, {rows, width}, DType::kBF16).to(Device::cuda(0));
}

// One case: B sequences whose cache holds `past` columns, then a step of T tokens (prefill when
// past = 0), heads / kv_heads of width d; median ms of the attention call alone, with the planned
// kernel and, for the flash kernel, with each block shape it has ("variant").
void run_case(const char* name, int64_t B, int64_t past, int64_t T, int64_t heads, int64_t kv_heads, int64_t d,
              int64_t dv = 0) {
  if (dv == 0) dv = d;
  std::mt19937 rng(1);
  const Device dev = Device::cuda(0);
  ops::KVCache cache(B, 1, past + T);
  ops::LayerKV& kv = cache.layers[0];
  if (past > 0) {
    ops::Step s(B, past, 0);
    ops::make_device_step(s, dev);
    ops::kv_append(kv, random_device(B * past, kv_heads * d, rng), random_device(B * past, kv_heads * dv, rng), s);
  }
  ops::Step step(B, T, past);
  ops::make_device_step(step, dev);
  ops::kv_append(kv, random_device(B * T, kv_heads * d, rng), random_device(B * T, kv_heads * dv, rng), step);
  const Tensor q = random_device(B * T, heads * d, rng);
  ops::AttentionSpec spec;
  spec.heads = heads;
  spec.kv_heads = kv_heads;
  spec.head_dim_k = d;
  spec.head_dim_v = dv;
  spec.scale = 1.0f / std::sqrt(float(d));
  const ops::cuda::AttentionShape shape = ops::cuda::attention_shape_of(q, kv, step, spec, DType::kBF16);
  const ops::cuda::AttentionPlan planned = ops::cuda::plan_attention(shape);
  std::vector<ops::cuda::AttentionPlan> plans{planned};
  // Prompts: cuDNN (where it loads) and the own flash kernel in each block shape, whichever is planned.
  ops::cuda::AttentionShape own = shape;
  own.cudnn = false;
  const ops::cuda::AttentionPlan flash = ops::cuda::plan_attention(own);
  if (T > ops::cuda::kAttentionDecodeTokens && planned.kernel != ops::cuda::AttentionKernel::kCudnn &&
      ops::cuda::cudnn_applies(shape))
    plans.push_back({ops::cuda::AttentionKernel::kCudnn});
  if (flash.kernel == ops::cuda::AttentionKernel::kFlashMma) {
    if (!(flash == planned)) plans.push_back(flash);
    for (ops::cuda::FlashBlock b : ops::cuda::kFlashBlocks)
      if (b != flash.flash_block && ops::cuda::flash_block_fits(b, d, dv)) plans.push_back({flash.kernel, 1, b});
  }
  // Decode: both split kernels over other split counts (the plan sizes them from the capacity).
  if (flash.kernel != ops::cuda::AttentionKernel::kFlashMma) {
    const auto other = planned.kernel == ops::cuda::AttentionKernel::kSplitVec ? ops::cuda::AttentionKernel::kSplitSimt
                                                                               : ops::cuda::AttentionKernel::kSplitVec;
    plans.push_back({other, planned.splits});
    for (int splits : {1, 2, 4, 8, 16, 32, 64})
      if (splits != planned.splits && splits * 32 <= past + T) plans.push_back({planned.kernel, splits});
  }
  for (const auto& plan : plans) {
    // The first call of a shape (cuDNN builds its graph then), wall clock.
    const auto t0 = std::chrono::steady_clock::now();
    (void)ops::cuda::attention_planned(q, kv, step, spec, DType::kBF16, plan);
    moex::cuda::synchronize();
    const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double ms = time_cuda_ms(
        dev, [&] { (void)ops::cuda::attention_planned(q, kv, step, spec, DType::kBF16, plan); }, false, 3, 20);
    // Causal pairs (query, key) and the flops of q.k and p.v over them.
    double pairs = 0;
    for (int64_t t = 0; t < T; ++t) pairs += double(past + t + 1);
    const double flops = 2.0 * double(B) * double(heads) * double(d + dv) * pairs;
    const double bytes = 2.0 * double(B) * double(past + T) * double(kv_heads) * double(d + dv);  // k and v, bf16
    std::printf("{\"case\": \"%s\", \"engine\": \"moex\", \"variant\": \"%s\", \"batch\": %lld, "
                "\"past\": %lld, \"tokens\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, "
                "\"ms\": %.4f, \"tflops\": %.1f, \"kv_gbps\": %.0f, \"first_call_ms\": %.1f}\n",
                name, plan.describe().c_str(), (long long)B, (long long)past, (long long)T, (long long)heads,
                (long long)kv_heads, (long long)d, ms, flops / ms / 1e9, bytes / ms / 1e6, first_ms);
  }
}

}  // namespace

int main() {
  // cuDNN graphs built at a shape's first call (timed as first_call_ms), not on the builder thread.
  ops::cuda::cudnn_attention_synchronous_builds(true);
  std::printf("{\"cudnn\": \"%s\"}\n", ops::cuda::cudnn_attention_status().c_str());
  // Qwen1.5-MoE-A2.7B (16 heads of 128, no GQA), Mixtral (32 / 8 of 128), gpt-oss (64 / 8 of 64).
  run_case("qwen prefill 4096", 1, 0, 4096, 16, 16, 128);
  run_case("qwen decode b1 4096", 1, 4096, 1, 16, 16, 128);
  run_case("qwen decode b1 192", 1, 191, 1, 16, 16, 128);
  run_case("qwen decode b1 1024", 1, 1023, 1, 16, 16, 128);
  run_case("qwen decode b32 256", 32, 256, 1, 16, 16, 128);
  run_case("qwen decode b32 4096", 32, 4096, 1, 16, 16, 128);
  run_case("mixtral prefill 4096", 1, 0, 4096, 32, 8, 128);
  run_case("mixtral decode b32 4096", 32, 4096, 1, 32, 8, 128);
  run_case("mixtral decode b1 4096", 1, 4096, 1, 32, 8, 128);
  run_case("gpt-oss prefill 4096", 1, 0, 4096, 64, 8, 64);
  run_case("gpt-oss decode b1 4096", 1, 4096, 1, 64, 8, 64);
  run_case("gpt-oss decode b32 1024", 32, 1024, 1, 64, 8, 64);
  run_case("qwen prefill 8 x 512", 8, 0, 512, 16, 16, 128);
  // Where cuDNN starts to pay (kCudnnMinTokens): Qwen prompts by length, and a prompt after a cache.
  for (int64_t t : {128, 256, 512, 1024, 2048}) run_case("qwen prefill by length", 1, 0, t, 16, 16, 128);
  run_case("qwen prefill 1024 after 3072", 1, 3072, 1024, 16, 16, 128);
  // New lengths: cuDNN's first_call_ms is the cost of planning a shape.
  for (int64_t t : {1000, 3000}) run_case("qwen prefill, new lengths", 1, 0, t, 16, 16, 128);
  run_case("128 heads prefill 4096", 1, 0, 4096, 128, 128, 128);
  // DeepSeek-V3's expanded MLA prompt: 128 heads, q / k 192 wide, v 128.
  run_case("deepseek mla prefill 4096", 1, 0, 4096, 128, 128, 192, 128);
  run_case("deepseek mla prefill 8 x 128", 8, 0, 128, 128, 128, 192, 128);
  return 0;
}
