// A replayed decode step on the GPU exchanges with the host once: its graph chooses the tokens
// and feeds them to the next step on the device, so nothing goes up, and the chosen ids come
// back in one copy with the one wait that copy implies. (A step launched directly, without a
// graph, takes one upload more: its ids and positions.) Counted with CUPTI's runtime-API
// callbacks, so that every cudaMemcpy* and every synchronisation in the process is seen (the
// library's own code, cuBLAS and the experts backends alike), not only the calls that pass
// through moex's helpers.
#include <gtest/gtest.h>

#include <string>

#include "moex/model.hpp"
#include "support/test_support.hpp"

#if MOEX_HAVE_CUPTI
#include <cupti.h>
#endif

namespace moex {
namespace {

#if MOEX_HAVE_CUPTI
struct Counters {
  int copies = 0;  // cudaMemcpy*, any direction and flavour
  int syncs = 0;   // cuda{Device,Stream,Event}Synchronize
};

void CUPTIAPI count_call(void* user, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER || !info->functionName) return;
  auto* c = static_cast<Counters*>(user);
  const std::string name = info->functionName;
  if (name.rfind("cudaMemcpy", 0) == 0) ++c->copies;
  if (name == "cudaDeviceSynchronize" || name == "cudaStreamSynchronize" || name == "cudaEventSynchronize")
    ++c->syncs;
}

class Counting {
 public:
  Counting() {
    EXPECT_EQ(cuptiSubscribe(&sub_, reinterpret_cast<CUpti_CallbackFunc>(count_call), &counters), CUPTI_SUCCESS);
    EXPECT_EQ(cuptiEnableDomain(1, sub_, CUPTI_CB_DOMAIN_RUNTIME_API), CUPTI_SUCCESS);
  }
  ~Counting() { cuptiUnsubscribe(sub_); }
  Counters counters;

 private:
  CUpti_SubscriberHandle sub_{};
};

Counters generate_counting(CausalLM& lm, const Tensor& prompt, int64_t new_tokens) {
  GenerationOptions g;
  g.max_new_tokens = new_tokens;
  g.eos_token_ids = std::vector<int64_t>{};  // every step runs
  Counting c;
  Tensor seq = lm.generate(prompt, g);
  EXPECT_EQ(seq.size(1), prompt.size(1) + new_tokens);
  return c.counters;
}
#endif

TEST(CudaStep, OneDownloadPerReplayedDecodeStep) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
#if !MOEX_HAVE_CUPTI
  GTEST_FAIL() << "CUDA build without CUPTI: the transfers cannot be counted";
#else
  for (const char* model : {"qwen2_moe", "deepseek_v3", "gpt_oss"}) {
    for (const char* backend : {"grouped_mm", "batched_mm"}) {
      LoadOptions o;
      o.dtype = DType::kBF16;
      o.device = Device::cuda(0);
      o.experts_implementation = {{"", backend}};
      auto lm = from_pretrained(test::data_path(std::string("hf-tiny/") + model + "/checkpoint_bf16"), o);
      const Tensor prompt = Tensor::from_ints({5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 5, 1}, {2, 6});
      generate_counting(*lm, prompt, 12);  // warm: plans, workspaces, caching allocator
      // The difference of two runs that differ only in their number of decode steps is what
      // those extra steps cost.
      const Counters a = generate_counting(*lm, prompt, 4);
      const Counters b = generate_counting(*lm, prompt, 12);
      const double copies = double(b.copies - a.copies) / 8, syncs = double(b.syncs - a.syncs) / 8;
      std::printf("%s %s: %.2f copies and %.2f synchronisations per decode step\n", model, backend, copies, syncs);
      EXPECT_TRUE(lm->last_generation_stats().graph) << lm->last_generation_stats().graph_note;
      EXPECT_LE(copies, 1.0) << model << " " << backend;
      EXPECT_LE(syncs, 1.0) << model << " " << backend;
    }
  }
#endif
}

}  // namespace
}  // namespace moex
