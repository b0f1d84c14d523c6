// Checks shared by the GPU suites of the Hopper-only experts backends (test_cuda_deepgemm.cpp,
// test_cuda_sonicmoe.cpp, test_cuda_dynamic_items.cpp). CUDA builds only: include it inside the
// suites' MOEX_WITH_CUDA part.
#pragma once

#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "cuda/experts_plan.hpp"
#include "cuda/runtime.hpp"
#include "moex/experts.hpp"
#include "moex/model.hpp"
#include "support/test_support.hpp"

namespace moex::test {

inline bool on_hopper() {
  return moex::cuda::device_count() > 0 &&
         moex::cuda::traits_of(moex::cuda::current_device()).hopper();
}

// GPU tests of the Hopper-only paths skip cleanly without a GPU and off Hopper (where the suites
// check the refusal instead).
#define SKIP_WITHOUT_HOPPER()                                                      \
  if (moex::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";           \
  if (!moex::test::on_hopper()) GTEST_SKIP() << "not a Hopper GPU (CC 9.0)"

inline Tensor on_gpu(const Tensor& t) { return t.defined() ? t.to(Device::cuda()) : t; }

// The shape a plan is made for: bf16 activations, T tokens, k experts per token, E x H x I
// experts, block-quantized weights when `quantized`.
inline moex::cuda::ExpertsShape experts_shape(bool quantized, int64_t T, int64_t k, int E, int H,
                                              int I) {
  moex::cuda::ExpertsShape s;
  s.elem = moex::cuda::Elem::kBF16;
  s.tokens = T;
  s.pairs = T * k;
  s.experts = E;
  s.hidden = H;
  s.intermediate = I;
  s.quantized = quantized;
  return s;
}

// One call of `backend` captured into a CUDA graph and replayed with new routing (duplicates,
// sentinels, empty experts; seeds seed + 9, + 10, + 11) written into the same device tensors:
// every replay equals a direct launch on that routing, bit for bit. k = 2, bf16 activations.
inline void expect_graph_replay_equals_direct(const std::string& backend, const ExpertsSpec& s,
                                              const ExpertsWeights& w, int64_t T, uint64_t seed) {
  namespace mc = moex::cuda;
  Experts experts(s, experts_weights_to(w, Device::cuda()));
  const Routing r0 = random_routing(s, T, 2, DType::kBF16, seed + 1, RoutingCase::kRandom);
  Tensor hidden = r0.hidden.to(Device::cuda()), idx = r0.top_k_index.to(Device::cuda()),
         tw = r0.top_k_weights.to(Device::cuda());
  (void)experts.forward(backend, hidden, idx, tw);  // warm: workspace cached
  mc::synchronize();
  cudaStream_t stream = mc::current_stream();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  Tensor out = experts.forward(backend, hidden, idx, tw);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    const RoutingCase rc = round == 0 ? RoutingCase::kDuplicates
                           : round == 1 ? RoutingCase::kSentinels
                                        : RoutingCase::kEmptyExperts;
    const Routing r = random_routing(s, T, 2, DType::kBF16, seed + 9 + uint64_t(round), rc);
    for (auto [dst, src] : {std::pair<Tensor*, const Tensor*>{&hidden, &r.hidden}, {&idx, &r.top_k_index},
                            {&tw, &r.top_k_weights}})
      mc::copy_bytes(dst->raw(), dst->device(), src->raw(), Device::cpu(), dst->nbytes());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    mc::synchronize();
    const Tensor replayed = out.to(Device::cpu());
    const Tensor direct = experts.forward(backend, hidden, idx, tw).to(Device::cpu());
    ASSERT_EQ(replayed.nbytes(), direct.nbytes());
    EXPECT_EQ(std::memcmp(replayed.raw(), direct.raw(), direct.nbytes()), 0)
        << backend << " T=" << T << " round " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// A fixture checkpoint (data_path-relative) on the GPU with `backend` for every sub-config.
inline std::unique_ptr<CausalLM> load_on_gpu(const std::string& dir, DType dtype, const std::string& backend) {
  LoadOptions o;
  o.dtype = dtype;
  o.device = Device::cuda();
  o.experts_implementation = {{"", backend}};
  return from_pretrained(data_path(dir), o);
}

}  // namespace moex::test
