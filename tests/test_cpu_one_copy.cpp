// One copy of the expert weights on the host: experts held as the hub's per-expert tensors (views
// into the checkpoint's memory map) are packed in place by grouped_mm and read in place by eager
// and batched_mm; a fused copy is made only for a backend that needs one. Checked here:
// - packing: byte-identical to the element-by-element formula of the packed layout, for both
//   weight forms, every layout, bf16 and fp32, ugly sizes;
// - the Experts module: every CPU backend gives bit-identical results on both forms, a backend
//   that reads only fused tensors gets them (made once), weights() materializes them;
// - a whole model from a hub-layout checkpoint of ~280 MB of bf16 experts: the resident memory
//   that loading + a forward add is one copy of the weights (anonymous growth, peak), the mapped
//   pages are given back after packing, and switching grouped_mm -> eager keeps the logits.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "cpu/engine.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

// The same experts in the per-expert form (the fused tensors' rows, copied).
ExpertsWeights per_expert_form(const ExpertsSpec& s, const ExpertsWeights& fused) {
  auto pe = std::make_shared<PerExpertWeights>();
  const int64_t I = s.intermediate;
  for (int64_t e = 0; e < s.num_experts; ++e) {
    const Tensor gu = fused.gate_up.select(0, e);
    pe->gate.push_back(gu.slice(0, 0, I).clone());
    pe->up.push_back(gu.slice(0, I, 2 * I).clone());
    pe->down.push_back(fused.down.select(0, e).clone());
  }
  ExpertsWeights w;
  w.per_expert = std::move(pe);
  return w;
}

// The packed layout by its definition (engine.hpp, kernels.hpp): packed column col of expert e
// is logical row row_of(col) (gated: 32-column blocks [16 gate | 16 up]), pair layout for bf16
// ([K/2][16][2]) and panel layout for fp32 ([K][16]), zeros elsewhere.
std::vector<uint8_t> packed_by_definition(const ExpertsSpec& s, const Tensor& t, bool gate_up,
                                          const cpu::PackedMatrices& pm) {
  const int64_t E = s.num_experts, I = s.intermediate;
  const int64_t N = gate_up ? s.gate_up_rows() : s.hidden, K = gate_up ? s.hidden : I;
  const size_t es = dtype_size(t.dtype());
  std::vector<uint8_t> out(pm.bytes(), 0);
  const auto* src = static_cast<const uint8_t*>(t.raw());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t col = 0; col < pm.n_pad; ++col) {
      int64_t n = col < N ? col : -1;
      if (gate_up && s.has_gate) {
        const int64_t i = col / 32 * 16 + col % 16;
        const bool up = col % 32 >= 16;
        n = i >= I ? -1 : s.is_concatenated ? (up ? I + i : i) : (up ? 2 * i + 1 : 2 * i);
      }
      if (n < 0) continue;
      for (int64_t c = 0; c < K; ++c) {
        const int64_t from = s.is_transposed ? e * N * K + c * N + n : e * N * K + n * K + c;
        const int64_t lane = col % 16, panel = col / 16;
        const int64_t at = e * pm.expert_stride + panel * pm.panel_stride +
                           (es == 2 ? (c / 2) * 32 + lane * 2 + (c & 1) : c * 16 + lane);
        std::memcpy(&out[size_t(at) * es], src + size_t(from) * es, es);
      }
    }
  return out;
}

bool same_bytes(const cpu::PackedMatrices& pm, const std::vector<uint8_t>& want) {
  return pm.bytes() == want.size() && std::memcmp(pm.data.get(), want.data(), want.size()) == 0;
}

TEST(CpuOneCopy, PackingMatchesTheLayoutDefinitionForBothForms) {
  for (DType dt : {DType::kBF16, DType::kF32})
    for (const auto& l : test::all_experts_layouts())
      for (auto [E, H, I] : {std::tuple<int64_t, int64_t, int64_t>{3, 19, 111}, {2, 64, 32}, {1, 1, 1}}) {
        if (l.bias) continue;  // biases are packed apart (float vectors)
        const ExpertsSpec s = test::make_experts_spec(l, E, H, I, Activation::kSilu);
        const ExpertsWeights w = test::random_experts_weights(s, dt, 7);
        SCOPED_TRACE(test::experts_layout_name(l) + " " + std::string(dtype_name(dt)) + " E=" +
                     std::to_string(E) + " H=" + std::to_string(H) + " I=" + std::to_string(I));
        auto p = cpu::prepare_cpu_experts(s, w, cpu::selected_kernel_path());
        EXPECT_TRUE(same_bytes(p->gate_up, packed_by_definition(s, w.gate_up, true, p->gate_up)));
        EXPECT_TRUE(same_bytes(p->down, packed_by_definition(s, w.down, false, p->down)));
        if (!l.gate || !l.concat || l.transposed) continue;  // the per-expert form's specs
        auto q = cpu::prepare_cpu_experts(s, per_expert_form(s, w), cpu::selected_kernel_path());
        EXPECT_TRUE(same_bytes(q->gate_up, packed_by_definition(s, w.gate_up, true, q->gate_up)));
        EXPECT_TRUE(same_bytes(q->down, packed_by_definition(s, w.down, false, q->down)));
      }
}

// A backend that reads only the fused tensors (no reads_per_expert): it runs eager on them and
// counts its preparations.
std::atomic<int> g_fused_prepares{0};
class FusedOnly final : public ExpertsBackend {
 public:
  BackendCaps caps() const override {
    BackendCaps c;
    c.devices = {DeviceKind::kCPU};
    c.dtypes = {DType::kF32, DType::kBF16};
    c.description = "test: reads gate_up / down";
    return c;
  }
  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec&, const ExpertsWeights& w) const override {
    EXPECT_TRUE(w.gate_up.defined() && w.down.defined());
    ++g_fused_prepares;
    return nullptr;
  }
  void forward(const ExpertsProblem& p, Tensor& out, const ExecContext& ctx) const override {
    ASSERT_TRUE(p.weights->gate_up.defined());
    get_experts_backend("eager")->forward(p, out, ctx);
  }
};

TEST(CpuOneCopy, ExpertsModuleServesEveryBackendFromThePerExpertForm) {
  register_experts_backend("test_fused_only", std::make_shared<FusedOnly>());
  const ExpertsSpec s = test::make_experts_spec({true, false, false, true}, 5, 67, 45, Activation::kSilu);
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const ExpertsWeights fused = test::random_experts_weights(s, dt, 3);
    const Experts a(s, fused), b(s, per_expert_form(s, fused));
    EXPECT_FALSE(b.stored_weights().fused());
    const auto r = test::random_routing(s, 19, 2, dt, 5, test::RoutingCase::kDuplicates);
    for (const char* name : {"grouped_mm", "eager", "batched_mm"}) {
      SCOPED_TRACE(std::string(name) + " " + std::string(dtype_name(dt)));
      const Tensor x = a.forward(name, r.hidden, r.top_k_index, r.top_k_weights);
      const Tensor y = b.forward(name, r.hidden, r.top_k_index, r.top_k_weights);
      EXPECT_EQ(x.to_float_vector(), y.to_float_vector());
    }
    // The fused copy appears for the first backend that needs it, once, and weights() returns it.
    g_fused_prepares = 0;
    const Tensor e = b.forward("eager", r.hidden, r.top_k_index, r.top_k_weights);
    const Tensor f = b.forward("test_fused_only", r.hidden, r.top_k_index, r.top_k_weights);
    (void)b.forward("test_fused_only", r.hidden, r.top_k_index, r.top_k_weights);
    EXPECT_EQ(g_fused_prepares.load(), 1);
    EXPECT_EQ(e.to_float_vector(), f.to_float_vector());
    EXPECT_EQ(b.weights().gate_up.to_float_vector(), fused.gate_up.to_float_vector());
    EXPECT_EQ(b.weights().down.to_float_vector(), fused.down.to_float_vector());
    // The model-independent call fuses for such a backend too.
    const Tensor g = experts_forward("test_fused_only", s, b.stored_weights(), r.hidden,
                                     r.top_k_index, r.top_k_weights);
    EXPECT_EQ(e.to_float_vector(), g.to_float_vector());
    // The float64 reference reads the per-expert form as it is.
    const Tensor ra = experts_reference_f64(s, fused, r.hidden, r.top_k_index, r.top_k_weights);
    const Tensor rb = experts_reference_f64(s, b.stored_weights(), r.hidden, r.top_k_index, r.top_k_weights);
    EXPECT_EQ(ra.to_float_vector(), rb.to_float_vector());
  }
}

TEST(CpuOneCopy, PerExpertFormIsValidated) {
  const ExpertsSpec s = test::make_experts_spec({true, false, false, true}, 3, 16, 8, Activation::kSilu);
  ExpertsWeights w = per_expert_form(s, test::random_experts_weights(s, DType::kF32, 1));
  auto broken = std::make_shared<PerExpertWeights>(*w.per_expert);
  broken->up[1] = Tensor::zeros({8, 15}, DType::kF32);
  ExpertsWeights bad = w;
  bad.per_expert = broken;
  try {
    Experts e(s, bad);
    FAIL() << "expected a shape error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("up_proj[1]"), std::string::npos) << e.what();
  }
  ExpertsSpec transposed = s;
  transposed.is_transposed = true;
  EXPECT_THROW(Experts(transposed, w), InvalidInput);
}

// ---- a whole model from a hub-layout checkpoint ----

int64_t proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size()));
  return -1;
}

// A qwen3_moe checkpoint, bf16, one tensor per expert, random weights ~ U(-a, a), a =
// 1/sqrt(fan_in); returns its size in bytes. Written by a child process, so that the writer's
// freed buffers cannot hide in (or inflate) this process's resident memory.
int64_t write_hub_checkpoint(const std::string& dir, const nlohmann::json& cfg) {
  const int64_t L = cfg["num_hidden_layers"], E = cfg["num_experts"], H = cfg["hidden_size"],
                I = cfg["moe_intermediate_size"], V = cfg["vocab_size"], D = cfg["head_dim"],
                Q = cfg["num_attention_heads"], KV = cfg["num_key_value_heads"];
  std::map<std::string, Shape> shapes = {{"model.embed_tokens.weight", {V, H}},
                                         {"lm_head.weight", {V, H}},
                                         {"model.norm.weight", {H}}};
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    shapes[p + "input_layernorm.weight"] = {H};
    shapes[p + "post_attention_layernorm.weight"] = {H};
    shapes[p + "self_attn.q_proj.weight"] = {Q * D, H};
    shapes[p + "self_attn.k_proj.weight"] = {KV * D, H};
    shapes[p + "self_attn.v_proj.weight"] = {KV * D, H};
    shapes[p + "self_attn.o_proj.weight"] = {H, Q * D};
    shapes[p + "self_attn.q_norm.weight"] = {D};
    shapes[p + "self_attn.k_norm.weight"] = {D};
    shapes[p + "mlp.gate.weight"] = {E, H};
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      shapes[x + "gate_proj.weight"] = {I, H};
      shapes[x + "up_proj.weight"] = {I, H};
      shapes[x + "down_proj.weight"] = {H, I};
    }
  }
  int64_t bytes = 0;
  for (const auto& [n, sh] : shapes) bytes += shape_numel(sh) * 2;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << cfg.dump();
  const pid_t pid = fork();
  if (pid == 0) {
    std::map<std::string, Tensor> tensors;
    uint32_t state = 2463534242u;
    for (const auto& [n, sh] : shapes) {
      Tensor t = Tensor::empty(sh, DType::kBF16);
      uint16_t* v = t.data<uint16_t>();
      const bool norm = sh.size() == 1;
      const float a = norm ? 0.f : 1.f / std::sqrt(float(sh.back()));
      for (int64_t i = 0; i < t.numel(); ++i) {
        state ^= state << 13, state ^= state >> 17, state ^= state << 5;
        v[i] = float_to_bf16(norm ? 1.f : a * (float(state >> 8) * (2.f / 16777216.f) - 1.f));
      }
      tensors[n] = std::move(t);
    }
    save_safetensors(dir + "/model.safetensors", tensors);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return bytes;
}

TEST(CpuOneCopy, HubCheckpointCostsOneCopyOfItsWeights) {
  char tmpl[] = "/tmp/moex_one_copy_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  nlohmann::json cfg = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"},
                        {"dtype", "bfloat16"}, {"hidden_size", 1024}, {"head_dim", 128},
                        {"num_attention_heads", 8}, {"num_key_value_heads", 2},
                        {"num_hidden_layers", 2}, {"num_experts", 16},
                        {"num_experts_per_tok", 4}, {"moe_intermediate_size", 1408},
                        {"intermediate_size", 2816}, {"decoder_sparse_step", 1},
                        {"mlp_only_layers", nlohmann::json::array()}, {"norm_topk_prob", true},
                        {"hidden_act", "silu"}, {"rms_norm_eps", 1e-6}, {"vocab_size", 256},
                        {"max_position_embeddings", 256}, {"tie_word_embeddings", false},
                        {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "default"}}}};
  const int64_t ckpt = write_hub_checkpoint(dir, cfg);
  ASSERT_FALSE(HasFailure());
  const double mb = 1e-3;  // kB -> MB
  const int64_t anon0 = proc_status_kb("RssAnon"), file0 = proc_status_kb("RssFile");
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
  const int64_t rss0 = proc_status_kb("VmRSS");
  const Tensor ids = Tensor::from_ints({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3}, {1, 16});
  {
    auto lm = from_pretrained(dir);  // bf16, grouped_mm
    const Tensor grouped = lm->logits(ids);
    const int64_t anon = proc_status_kb("RssAnon") - anon0, file = proc_status_kb("RssFile") - file0;
    const int64_t peak = proc_status_kb("VmHWM") - rss0;
    const double ck = double(ckpt) * 1e-6;
    std::printf("checkpoint %.0f MB: anonymous +%.0f MB, file-backed +%.0f MB, peak +%.0f MB\n", ck,
                double(anon) * mb, double(file) * mb, double(peak) * mb);
    // Every weight is packed once (these shapes need no padding), nothing else is that large.
    EXPECT_LE(double(anon) * mb, 1.10 * ck) << "a second copy of the weights is resident";
    EXPECT_LE(double(peak) * mb, 1.15 * ck);
    EXPECT_LE(double(file) * mb, 0.10 * ck) << "mapped pages were not given back after packing";
    // Switching to a backend that reads the per-expert tensors in place adds no fused copy.
    lm->set_experts_implementation("eager");
    const Tensor eager = lm->logits(ids);
    const int64_t anon_eager = proc_status_kb("RssAnon") - anon0;
    EXPECT_LE(double(anon_eager) * mb, 1.10 * ck);
    EXPECT_LT(rel_l2_error(eager, grouped), 1e-2);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace moex
