#include "support/test_support.hpp"

#include "core/device_hooks.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "moex/safetensors.hpp"

namespace moex::test {

static std::vector<float> uniform(size_t n, float a, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(-a, a);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

ExpertsWeights random_experts_weights(const ExpertsSpec& s, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ExpertsWeights w;
  const int64_t R = s.gate_up_rows();
  auto gu = s.gate_up_shape(), dn = s.down_shape();
  w.gate_up = Tensor::from_floats(uniform(size_t(shape_numel(gu)), 1.f / std::sqrt(float(s.hidden)), rng), gu, dtype);
  w.down = Tensor::from_floats(uniform(size_t(shape_numel(dn)), 1.f / std::sqrt(float(s.intermediate)), rng), dn, dtype);
  if (s.has_bias) {
    w.gate_up_bias = Tensor::from_floats(uniform(size_t(s.num_experts * R), 0.5f, rng), {s.num_experts, R}, dtype);
    w.down_bias = Tensor::from_floats(uniform(size_t(s.num_experts * s.hidden), 0.5f, rng), {s.num_experts, s.hidden}, dtype);
  }
  return w;
}

std::vector<ExpertsLayout> all_experts_layouts() {
  std::vector<ExpertsLayout> v;
  for (bool bias : {false, true})
    for (bool tr : {false, true}) {
      v.push_back({true, bias, tr, true});
      v.push_back({true, bias, tr, false});
      v.push_back({false, bias, tr, true});
    }
  return v;
}

std::string experts_layout_name(const ExpertsLayout& l) {
  return std::string(l.gate ? (l.concat ? "gated_concat" : "gated_interleaved") : "ungated") +
         (l.bias ? "_bias" : "") + (l.transposed ? "_transposed" : "");
}

ExpertsSpec make_experts_spec(const ExpertsLayout& l, int64_t E, int64_t H, int64_t I,
                              Activation act) {
  ExpertsSpec s;
  s.num_experts = E;
  s.hidden = H;
  s.intermediate = I;
  s.has_gate = l.gate;
  s.has_bias = l.bias;
  s.is_transposed = l.transposed;
  s.is_concatenated = l.concat;
  s.act = act;
  s.swiglu_limit = 1.5f;
  return s;
}

std::string routing_case_name(RoutingCase c) {
  switch (c) {
    case RoutingCase::kRandom: return "random";
    case RoutingCase::kEveryExpert: return "every_expert";
    case RoutingCase::kEmptyExperts: return "empty_experts";
    case RoutingCase::kDuplicates: return "duplicates";
    case RoutingCase::kSentinels: return "sentinels";
  }
  return "?";
}

Routing random_routing(const ExpertsSpec& s, int64_t T, int64_t k, DType dtype, uint64_t seed,
                       RoutingCase c, bool per_expert_weights, DType index_dtype) {
  std::mt19937_64 rng(seed * 7919 + 17);
  const int64_t E = s.num_experts;
  Routing r;
  r.hidden = Tensor::from_floats(uniform(size_t(T * s.hidden), 1.f, rng), {T, s.hidden}, dtype);
  std::vector<int64_t> ids(static_cast<size_t>(T * k));
  std::vector<int64_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    int64_t pool = E;
    if (c == RoutingCase::kEmptyExperts) pool = std::max<int64_t>(1, E / 3);
    std::shuffle(perm.begin(), perm.begin() + pool, rng);
    for (int64_t j = 0; j < k; ++j) {
      int64_t id = perm[size_t(j % pool)];
      if (c == RoutingCase::kEveryExpert) id = (t * k + j) % E;
      if (c == RoutingCase::kDuplicates && j == 1) id = ids[size_t(t * k)];
      if (c == RoutingCase::kSentinels && rng() % 4 == 0) id = E + int64_t(rng() % 3);
      ids[size_t(t * k + j)] = id;
    }
  }
  r.top_k_index = Tensor::from_ints(ids, {T, k}, index_dtype);
  std::uniform_real_distribution<float> pos(0.05f, 1.f);
  int64_t cols = per_expert_weights ? E : k;
  std::vector<float> w(static_cast<size_t>(T * cols));
  for (auto& x : w) x = pos(rng);
  r.top_k_weights = Tensor::from_floats(w, {T, cols}, DType::kF32);
  return r;
}

namespace {
nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(f);
}

// Stacks per-expert [rows, cols] matrices (first the `first` names, then the `second` names per
// expert) into [E, rows_a + rows_b, cols], fp32.
Tensor stack_experts(const SafetensorsFile& f, const std::string& prefix, int64_t E,
                     const std::vector<std::string>& parts) {
  std::vector<float> all;
  Shape one;
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e)
    for (const auto& part : parts) {
      Tensor t = f.get(prefix + "." + std::to_string(e) + "." + part + ".weight");
      auto v = t.to_float_vector();
      all.insert(all.end(), v.begin(), v.end());
      if (e == 0) rows += t.size(0);
      one = t.shape();
    }
  return Tensor::from_floats(all, {E, rows, one[1]});
}

}  // namespace

ExpertsFixture load_experts_fixture(const std::string& model) {
  const std::string dir = data_path("hf-tiny/" + model);
  auto meta = read_json(dir + "/meta.json");
  auto config = read_json(dir + "/checkpoint_fp32/config.json");
  auto f = SafetensorsFile::open(dir + "/checkpoint_fp32/model.safetensors");
  std::string module = meta["experts_module"];
  auto flags = meta["experts_flags"];
  ExpertsFixture fx;
  ExpertsSpec& s = fx.spec;
  s.has_gate = flags["has_gate"];
  s.has_bias = flags["has_bias"];
  s.is_transposed = flags["is_transposed"];
  s.is_concatenated = flags["is_concatenated"];
  s.hidden = config["hidden_size"];
  if (model == "gpt_oss") {
    s.act = Activation::kSwigluOai;
    s.swiglu_limit = config.value("swiglu_limit", 7.0f);
    s.swiglu_alpha = 1.702f;
    fx.weights.gate_up = f->get(module + ".gate_up_proj");
    fx.weights.gate_up_bias = f->get(module + ".gate_up_proj_bias");
    fx.weights.down = f->get(module + ".down_proj");
    fx.weights.down_bias = f->get(module + ".down_proj_bias");
    s.num_experts = fx.weights.gate_up.size(0);
    s.intermediate = fx.weights.down.size(1);
    return fx;
  }
  s.act = parse_activation(config["hidden_act"].get<std::string>());
  // Mixtral's hub names: block_sparse_moe.experts.N.{w1 = gate, w3 = up, w2 = down}.
  std::string prefix = module;
  std::vector<std::string> gate_up = {"gate_proj", "up_proj"};
  std::string down = "down_proj";
  if (!f->contains(prefix + ".0.gate_proj.weight")) {
    prefix = module.substr(0, module.find(".mlp.")) + ".block_sparse_moe.experts";
    gate_up = {"w1", "w3"};
    down = "w2";
  }
  int64_t E = 0;
  while (f->contains(prefix + "." + std::to_string(E) + "." + down + ".weight")) ++E;
  s.num_experts = E;
  fx.weights.gate_up = stack_experts(*f, prefix, E, gate_up);
  fx.weights.down = stack_experts(*f, prefix, E, {down});
  s.intermediate = fx.weights.down.size(2);
  return fx;
}

std::string data_path(const std::string& relative) {
  return std::string(MOEX_TEST_DATA) + "/" + relative;
}

ExpertsWeights experts_weights_to(const ExpertsWeights& w, Device device) {
  auto to = [&](const Tensor& t) { return t.defined() ? t.to(device) : t; };
  ExpertsWeights g = w;
  g.gate_up = to(w.gate_up);
  g.down = to(w.down);
  g.gate_up_bias = to(w.gate_up_bias);
  g.down_bias = to(w.down_bias);
  g.gate_up_scale = to(w.gate_up_scale);
  g.down_scale = to(w.down_scale);
  return g;
}

namespace {

void run_experts_case(Device device, const std::string& backend, const ExpertsSpec& s, DType dt,
                      int64_t T, int64_t k, RoutingCase rc, uint64_t seed, bool per_expert,
                      DType idx_dt, const WeightsPerturbation& perturb) {
  ExpertsWeights w = random_experts_weights(s, dt, seed);
  Routing r = random_routing(s, T, k, dt, seed, rc, per_expert, idx_dt);
  Tensor ref = experts_reference_f64(s, w, r.hidden, r.top_k_index, r.top_k_weights);
  ExpertsWeights used = w;
  if (perturb) perturb(used);
  Tensor out = experts_forward(backend, s, experts_weights_to(used, device), r.hidden.to(device),
                               r.top_k_index.to(device), r.top_k_weights.to(device));
  ASSERT_EQ(out.device(), device);
  ASSERT_EQ(out.shape(), (Shape{T, s.hidden}));
  ASSERT_EQ(out.dtype(), dt);
  const double err = rel_l2_error(out.to(Device::cpu()), ref);
  const double tol = experts_tolerance(dt, std::max(s.hidden, s.intermediate));
  EXPECT_LE(err, tol) << "backend=" << backend << " device=" << device.str()
                      << " spec=" << s.str() << " dtype=" << dtype_name(dt) << " T=" << T
                      << " k=" << k << " routing=" << routing_case_name(rc)
                      << " per_expert=" << per_expert << " seed=" << seed
                      << (perturb ? " (weights perturbed)" : "");
}

}  // namespace

void check_experts_case(Device device, const std::string& backend, const ExpertsSpec& s,
                        DType dt, int64_t T, int64_t k, RoutingCase rc, uint64_t seed,
                        bool per_expert, DType idx_dt) {
  run_experts_case(device, backend, s, dt, T, k, rc, seed, per_expert, idx_dt, {});
}

void check_experts_case_perturbed(Device device, const std::string& backend,
                                  const ExpertsSpec& s, DType dt, int64_t T, int64_t k,
                                  RoutingCase rc, uint64_t seed,
                                  const WeightsPerturbation& perturb) {
  run_experts_case(device, backend, s, dt, T, k, rc, seed, false, DType::kI64, perturb);
}

Tensor add_largest_magnitude(const Tensor& t, int64_t index) {
  std::vector<float> v = t.to_float_vector();
  float largest = 0;
  for (float x : v) largest = std::max(largest, std::fabs(x));
  v.at(size_t(index)) += largest;
  return Tensor::from_floats(v, t.shape(), t.dtype());
}

int cuda_devices() { return detail::cuda_device_count(); }

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

namespace {
// A new empty file under `dir` that no other process owns: CTest runs test cases in parallel and
// several pass the same shared directory (testing::TempDir()).
std::string unique_file(const std::string& dir, const char* stem) {
  std::string path = dir + "/" + stem + "_XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd < 0) throw std::runtime_error("run_cli: cannot create a file under " + dir);
  ::close(fd);
  return path;
}
}  // namespace

CliResult run_cli(const std::string& args, const std::string& tmp_dir) {
  const std::string out = unique_file(tmp_dir, "moex_cli_stdout"), err = unique_file(tmp_dir, "moex_cli_stderr");
  const std::string cmd = std::string(MOEX_CLI_PATH) + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

ExpertsSpec quantized_spec(QuantScheme::Kind kind, DType scale_dtype, int64_t E, int64_t H,
                           int64_t I, bool gated, Activation act) {
  ExpertsSpec s;
  s.num_experts = E;
  s.hidden = H;
  s.intermediate = I;
  s.has_gate = gated;
  s.act = act;
  s.quant.kind = kind;
  const bool fp4 = kind == QuantScheme::Kind::kFp4E2M1;
  s.quant.scale_dtype = fp4 ? DType::kF8E8M0 : scale_dtype;
  s.quant.block_n = fp4 ? 1 : 128;
  s.quant.block_k = fp4 ? 32 : 128;
  return s;
}

double l2_diff(const Tensor& out, const Tensor& ref) {
  const std::vector<float> o = out.to_float_vector();
  const double* r = ref.data<double>();
  double s = 0;
  for (size_t i = 0; i < o.size(); ++i) s += (double(o[i]) - r[i]) * (double(o[i]) - r[i]);
  return std::sqrt(s);
}

double l2_f64(const Tensor& ref) {
  const double* r = ref.data<double>();
  double s = 0;
  for (int64_t i = 0; i < int64_t(ref.numel()); ++i) s += r[i] * r[i];
  return std::sqrt(s);
}

void expect_no_rank_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    if (errors[r]) {
      try {
        std::rethrow_exception(errors[r]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    }
}

}  // namespace moex::test
