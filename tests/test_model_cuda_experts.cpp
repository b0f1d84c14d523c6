// Models with their experts on a CUDA device (the rest of the model on the host): logits from
// every backend against transformers' bf16 logits and against the all-CPU model, and the
// decode-stage switch on a real GPU. Skips where no CUDA device is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/device_hooks.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

class CudaExperts : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (detail::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

std::unique_ptr<CausalLM> load(const std::string& model, const std::string& ckpt, DType dtype,
                               Device device, const std::string& backend) {
  LoadOptions o;
  o.dtype = dtype;
  o.device = device;
  o.experts_implementation = {{"", backend}};
  return from_pretrained(test::data_path("hf-tiny/" + model + "/" + ckpt), o);
}

TEST_P(CudaExperts, Bf16LogitsMatchTransformersAndTheCpuModel) {
  const std::string backend = GetParam();
  for (const char* model : {"qwen2_moe", "mixtral", "olmoe", "qwen3_moe"}) {
    auto ref = SafetensorsFile::open(test::data_path(std::string("hf-tiny/") + model + "/reference.safetensors"));
    Tensor ids = ref->get("input_ids");
    std::unique_ptr<CausalLM> gpu;
    try {
      gpu = load(model, "checkpoint_bf16", DType::kBF16, Device::cuda(0), backend);
    } catch (const Unsupported& e) {
      GTEST_SKIP() << backend << " on CUDA: " << e.what();
    }
    Tensor g = gpu->logits(ids);
    Tensor c = load(model, "checkpoint_bf16", DType::kBF16, Device::cpu(), backend)->logits(ids);
    const double tol = 8.0 * std::ldexp(1.0, -8);
    EXPECT_LE(test::rel_l2_error(g, ref->get("logits_bf16_eager")), tol) << model << " " << backend;
    EXPECT_LE(test::rel_l2_error(g, c), tol) << model << " " << backend;
  }
}

TEST_P(CudaExperts, GenerateRestoresTheMapOnARealGpu) {
  const std::string backend = GetParam();
  std::unique_ptr<CausalLM> lm;
  try {
    lm = load("qwen2_moe", "checkpoint_bf16", DType::kBF16, Device::cuda(0), backend);
  } catch (const Unsupported& e) {
    GTEST_SKIP() << backend << " on CUDA: " << e.what();
  }
  GenerationOptions g;
  g.max_new_tokens = 8;
  Tensor seq = lm->generate(Tensor::from_ints({1, 2, 3, 4}, {1, 4}), g);
  EXPECT_EQ(seq.size(1), 12);
  EXPECT_EQ(lm->get_experts_implementation(), (ExpertsImplementation{{"", backend}}));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, CudaExperts, ::testing::Values("eager", "batched_mm", "grouped_mm"));

}  // namespace
}  // namespace moex
