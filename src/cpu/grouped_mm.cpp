// `grouped_mm` on CPU: sort (token, slot) pairs by expert, run each expert's tokens as one matrix
// product on weights packed once at prepare time, fuse gate/up with the activation, un-permute by
// writing each result to its pair's row, then combine in slot order. The work runs on the CPU
// engine (src/cpu/engine.hpp: AMX / AVX512-BF16 / AVX-512 / AVX2 / portable kernels picked at run
// time; make_cpu_grouped_mm_backend(path) in moex/cpu_kernels.hpp runs a chosen one). Weights the
// engine does not pack (float16) run the portable grouped loop below, with the same numerics.
#include <vector>

#include "cpu/backends.hpp"
#include "cpu/engine.hpp"
#include "cpu/experts_common.hpp"
#include "cpu/experts_quant.hpp"

namespace moex::cpu {
namespace {

class GroupedMmCpu final : public ExpertsBackend {
 public:
  BackendCaps caps() const override {
    return cpu_caps("tokens sorted by expert, one grouped product on pre-packed weights "
                    "(AMX/AVX-512/AVX2 engine); the CPU default; FP8/FP4 weights unpacked, "
                    "decoded in registers");
  }

  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& spec,
                                           const ExpertsWeights& weights) const override {
    const DType dt = weights.dtype();
    // Quantized weights are read as stored: packing them would be a second copy.
    if (spec.quant.quantized() && weights.device().host_accessible())
      return prepare_quantized_experts(weights);
    if (spec.quant.quantized() || !weights.device().host_accessible() ||
        !cpu_engine_unsupported_reason(spec, dt, dt).empty())
      return nullptr;
    return prepare_cpu_experts(spec, weights, selected_kernel_path());
  }

  // Host code: runs synchronously on the calling thread (and its OpenMP team); the context adds
  // nothing on the CPU.
  void forward(const ExpertsProblem& p, Tensor& out, const ExecContext&) const override {
    if (p.spec->quant.quantized()) return quant_grouped_forward(p, out, /*all_at_once=*/true);
    if (const auto* packed = dynamic_cast<const PreparedCpuExperts*>(p.prepared)) {
      run_cpu_experts(*packed, p, out);
      return;
    }
    forward_portable(p, out);
  }

 private:
  // Unpacked fallback (float16 weights): experts over threads, strided reads of the weights.
  static void forward_portable(const ExpertsProblem& p, Tensor& out) {
    const ExpertsSpec& s = *p.spec;
    const int64_t H = s.hidden;
    RoutingView r(p);
    ExpertGroups g = group_by_expert(r);
    std::vector<float> pair_out(size_t(r.T * r.k * H), 0.f);
#pragma omp parallel
    {
      std::vector<float> x, y, scratch;
#pragma omp for schedule(dynamic, 1)
      for (int64_t e = 0; e < s.num_experts; ++e) {
        const int64_t n = g.count(e);
        if (n == 0) continue;
        gather_expert_rows(p, r, g, e, x);
        y.resize(size_t(n * H));
        expert_mlp_rows(s, *p.weights, e, x.data(), n, y.data(), p.hidden.dtype(), scratch);
        scatter_expert_rows(g, e, y.data(), H, pair_out.data());
      }
    }
    combine(r, pair_out.data(), H, out);
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm", GroupedMmCpu);

}  // namespace
}  // namespace moex::cpu
