// `eager` on CPU: the reference loop of transformers — for each expert that received tokens,
// gather its tokens, run the expert MLP on them, scatter the results. Experts run one after
// another (like transformers); threads split each expert's matrix products by output rows.
#include <vector>

#include "cpu/backends.hpp"
#include "cpu/experts_common.hpp"
#include "cpu/experts_quant.hpp"

namespace moex::cpu {
namespace {

class EagerCpu final : public ExpertsBackend {
 public:
  BackendCaps caps() const override {
    return cpu_caps("loop over the experts that received tokens (reference); FP8/FP4 weights "
                    "decoded in registers");
  }

  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& spec,
                                           const ExpertsWeights& weights) const override {
    if (spec.quant.quantized() && weights.device().host_accessible())
      return prepare_quantized_experts(weights);
    return nullptr;
  }

  // Host code: runs synchronously on the calling thread (and its OpenMP team); the context adds
  // nothing on the CPU.
  void forward(const ExpertsProblem& p, Tensor& out, const ExecContext&) const override {
    // Quantized: the same loop over experts; threads split each expert's products by rows.
    if (p.spec->quant.quantized()) return quant_grouped_forward(p, out, /*all_at_once=*/false);
    const ExpertsSpec& s = *p.spec;
    const int64_t H = s.hidden;
    RoutingView r(p);
    ExpertGroups g = group_by_expert(r);
    std::vector<float> pair_out(size_t(r.T * r.k * H), 0.f);
    std::vector<float> x, y;
    for (int64_t e = 0; e < s.num_experts; ++e) {
      const int64_t n = g.count(e);
      if (n == 0) continue;
      gather_expert_rows(p, r, g, e, x);
      y.resize(size_t(n * H));
      // Split the tokens of this expert across threads; each runs the whole MLP on its rows.
#pragma omp parallel
      {
        std::vector<float> scratch;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; ++i)
          expert_mlp_rows(s, *p.weights, e, x.data() + i * H, 1, y.data() + i * H,
                          p.hidden.dtype(), scratch);
      }
      scatter_expert_rows(g, e, y.data(), H, pair_out.data());
    }
    combine(r, pair_out.data(), H, out);
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("eager", EagerCpu);

}  // namespace
}  // namespace moex::cpu
