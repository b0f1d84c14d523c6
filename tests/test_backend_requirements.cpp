// The requirement checks of "deepgemm", "deepgemm_megamoe" and "sonicmoe"
// (moex/backend_requirements.hpp),
// run without a GPU through injected device descriptions: every requirement error, the order in
// which they are reported, and the accepted cases. Then the same errors as a user meets them:
// through the experts interface and the CLI (exit code 2, one line), and the static-activation
// rule every backend applies.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "moex/backend_requirements.hpp"
#include "moex/bench.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "support/test_support.hpp"

using namespace moex;
using namespace moex::test;

namespace {

DeviceDescription gpu(int major, int minor, const char* name = "") {
  DeviceDescription d;
  d.cuda = true;
  d.cc_major = major;
  d.cc_minor = minor;
  d.name = name;
  return d;
}
const DeviceDescription kHost{};
const DeviceDescription kAda = gpu(8, 9, "NVIDIA L40S");
const DeviceDescription kAmpere = gpu(8, 0, "NVIDIA A100");
const DeviceDescription kHopper = gpu(9, 0, "NVIDIA H200");
const DeviceDescription kBlackwell = gpu(10, 0, "NVIDIA B200");

ExpertsSpec bf16_spec(int64_t H = 256, int64_t I = 128) {
  ExpertsSpec s;
  s.num_experts = 8;
  s.hidden = H;
  s.intermediate = I;
  return s;
}
ExpertsSpec fp8_spec(DType scales = DType::kF32) {
  return quantized_spec(QuantScheme::Kind::kFp8E4M3, scales, 8, 256, 128);
}
ExpertsSpec fp4_spec() { return quantized_spec(QuantScheme::Kind::kFp4E2M1, DType::kF8E8M0, 8, 256, 128); }

// `why` is non-empty and contains every fragment.
void expect_reason(const std::string& why, std::initializer_list<const char*> fragments) {
  EXPECT_FALSE(why.empty());
  for (const char* f : fragments) EXPECT_NE(why.find(f), std::string::npos) << "'" << f << "' not in: " << why;
}

TEST(DeepGemmRequirements, HopperServesBf16AndFp8WithEitherScaleFormat) {
  EXPECT_EQ(deepgemm_unsupported(bf16_spec(), DType::kBF16, kHopper), "");
  EXPECT_EQ(deepgemm_unsupported(fp8_spec(DType::kF32), DType::kBF16, kHopper), "");
  // Hopper consumes float32 block scales directly, and UE8M0 ones decoded.
  EXPECT_EQ(deepgemm_unsupported(fp8_spec(DType::kF8E8M0), DType::kBF16, kHopper), "");
  ExpertsSpec biased = bf16_spec();
  biased.has_bias = true;
  EXPECT_EQ(deepgemm_unsupported(biased, DType::kBF16, kHopper), "");
  ExpertsSpec ungated = bf16_spec();
  ungated.has_gate = false;
  EXPECT_EQ(deepgemm_unsupported(ungated, DType::kBF16, kHopper), "");
}

TEST(DeepGemmRequirements, ComputeCapabilityBelowHopper) {
  for (const DeviceDescription& d : {kAda, kAmpere}) {
    const std::string why = deepgemm_unsupported(fp8_spec(), DType::kBF16, d);
    expect_reason(why, {"compute capability 9.0", d.name.c_str(), "use grouped_mm"});
  }
  expect_reason(deepgemm_unsupported(bf16_spec(), DType::kBF16, kHost), {"Hopper", "no CUDA device"});
}

TEST(DeepGemmRequirements, StaticActivationSchemeSaysUseDynamic) {
  ExpertsSpec s = fp8_spec();
  s.quant.activations = QuantScheme::Activations::kStatic;
  expect_reason(deepgemm_unsupported(s, DType::kBF16, kHopper), {"'static'", "'dynamic'"});
}

TEST(DeepGemmRequirements, Fp8BlockSizeOtherThan128x128) {
  for (auto [bn, bk] : {std::pair<int64_t, int64_t>{1, 128}, {64, 64}, {128, 64}}) {
    ExpertsSpec s = fp8_spec();
    s.quant.block_n = bn;
    s.quant.block_k = bk;
    expect_reason(deepgemm_unsupported(s, DType::kBF16, kHopper),
                  {"128 x 128", (std::to_string(bn) + " x " + std::to_string(bk)).c_str()});
  }
}

TEST(DeepGemmRequirements, Fp4ExpertsOnHopper) {
  expect_reason(deepgemm_unsupported(fp4_spec(), DType::kBF16, kHopper), {"FP4", "Blackwell", "FP8 checkpoint"});
}

TEST(DeepGemmRequirements, BlackwellWantsUe8m0ScalesThenHasNoBuild) {
  // float32 scales on Blackwell: the error names the scales, never a silent rounding.
  expect_reason(deepgemm_unsupported(fp8_spec(DType::kF32), DType::kBF16, kBlackwell),
                {"UE8M0", "float32", "scale_fmt 'ue8m0'", "NVIDIA B200"});
  // With UE8M0 scales (or bf16 experts) the remaining reason is moex's build.
  for (const ExpertsSpec& s : {fp8_spec(DType::kF8E8M0), bf16_spec(), fp4_spec()})
    expect_reason(deepgemm_unsupported(s, DType::kBF16, kBlackwell), {"sm_90a", "use grouped_mm"});
}

TEST(DeepGemmRequirements, ActivationDtypeAndLayout) {
  for (DType act : {DType::kF16, DType::kF32})
    expect_reason(deepgemm_unsupported(bf16_spec(), act, kHopper), {"bfloat16", dtype_name(act).data()});
  ExpertsSpec t = bf16_spec();
  t.is_transposed = true;
  expect_reason(deepgemm_unsupported(t, DType::kBF16, kHopper), {"transposed"});
  ExpertsSpec il = bf16_spec();
  il.is_concatenated = false;
  expect_reason(deepgemm_unsupported(il, DType::kBF16, kHopper), {"interleaved"});
  expect_reason(deepgemm_unsupported(bf16_spec(260, 124), DType::kBF16, kHopper), {"multiples of 8", "H = 260"});
  ExpertsSpec q = quantized_spec(QuantScheme::Kind::kFp8E4M3, DType::kF32, 8, 264, 128);
  expect_reason(deepgemm_unsupported(q, DType::kBF16, kHopper), {"multiples of 16", "H = 264"});
}

TEST(DeepGemmMegaMoeRequirements, EachRequirementInTurn) {
  const ExpertsSpec fp4 = fp4_spec();
  expect_reason(deepgemm_megamoe_unsupported(fp4, DType::kBF16, kHopper, 2),
                {"Blackwell", "compute capability 10.0", "NVIDIA H200", "deepgemm"});
  expect_reason(deepgemm_megamoe_unsupported(fp4, DType::kBF16, kAda, 2), {"Blackwell", "use grouped_mm"});
  expect_reason(deepgemm_megamoe_unsupported(fp4, DType::kBF16, kHost, 2), {"Blackwell", "no CUDA device"});
  expect_reason(deepgemm_megamoe_unsupported(fp8_spec(DType::kF8E8M0), DType::kBF16, kBlackwell, 2),
                {"FP4", "FP8", "use deepgemm"});
  expect_reason(deepgemm_megamoe_unsupported(bf16_spec(), DType::kBF16, kBlackwell, 2), {"FP4", "unquantized"});
  ExpertsSpec f32_scales = fp4;
  f32_scales.quant.scale_dtype = DType::kF32;
  expect_reason(deepgemm_megamoe_unsupported(f32_scales, DType::kBF16, kBlackwell, 2), {"UE8M0", "float32"});
  ExpertsSpec st = fp4;
  st.quant.activations = QuantScheme::Activations::kStatic;
  expect_reason(deepgemm_megamoe_unsupported(st, DType::kBF16, kBlackwell, 2), {"'static'", "'dynamic'"});
  expect_reason(deepgemm_megamoe_unsupported(fp4, DType::kBF16, kBlackwell, 1), {"expert-parallel group"});
  // Every requirement met: moex still has no build of the kernel, and says so.
  expect_reason(deepgemm_megamoe_unsupported(fp4, DType::kBF16, kBlackwell, 2), {"no build", "use grouped_mm"});
}

TEST(SonicMoeRequirements, HopperServesGatedBf16AndF16) {
  EXPECT_EQ(sonicmoe_unsupported(bf16_spec(), DType::kBF16, kHopper), "");
  EXPECT_EQ(sonicmoe_unsupported(bf16_spec(), DType::kF16, kHopper), "");
  ExpertsSpec biased = bf16_spec(264, 200);
  biased.has_bias = true;
  EXPECT_EQ(sonicmoe_unsupported(biased, DType::kBF16, kHopper), "");
  for (Activation a : {Activation::kGelu, Activation::kRelu}) {
    ExpertsSpec s = bf16_spec();
    s.act = a;
    EXPECT_EQ(sonicmoe_unsupported(s, DType::kBF16, kHopper), "") << activation_name(a);
  }
}

// Every requirement, in the order a user would fix them: the device, then the experts, then
// the dtype and the layout.
TEST(SonicMoeRequirements, EachUnmetRequirementIsNamed) {
  expect_reason(sonicmoe_unsupported(bf16_spec(), DType::kBF16, kHost), {"Hopper", "no CUDA device", "use grouped_mm"});
  for (const DeviceDescription& d : {kAmpere, kAda})
    expect_reason(sonicmoe_unsupported(bf16_spec(), DType::kBF16, d), {"compute capability 9.0", "wgmma"});
  expect_reason(sonicmoe_unsupported(bf16_spec(), DType::kBF16, kBlackwell), {"sm_90a", "NVIDIA B200", "use grouped_mm"});
  ExpertsSpec ungated = bf16_spec();
  ungated.has_gate = false;
  expect_reason(sonicmoe_unsupported(ungated, DType::kBF16, kHopper), {"gated", "no gate"});
  ExpertsSpec tanh = bf16_spec();
  tanh.act = Activation::kGeluTanh;
  expect_reason(sonicmoe_unsupported(tanh, DType::kBF16, kHopper), {"silu, gelu and relu", "gelu_pytorch_tanh"});
  ExpertsSpec oai = bf16_spec();
  oai.act = Activation::kSwigluOai;
  expect_reason(sonicmoe_unsupported(oai, DType::kBF16, kHopper), {"gpt-oss", "use grouped_mm"});
  expect_reason(sonicmoe_unsupported(fp8_spec(), DType::kBF16, kHopper), {"FP8", "deepgemm", "--dequantize"});
  expect_reason(sonicmoe_unsupported(fp4_spec(), DType::kBF16, kHopper), {"FP4"});
  expect_reason(sonicmoe_unsupported(bf16_spec(), DType::kF32, kHopper), {"bfloat16 or float16", "float32"});
  ExpertsSpec t = bf16_spec();
  t.is_transposed = true;
  expect_reason(sonicmoe_unsupported(t, DType::kBF16, kHopper), {"transposed"});
  ExpertsSpec il = bf16_spec();
  il.is_concatenated = false;
  expect_reason(sonicmoe_unsupported(il, DType::kBF16, kHopper), {"interleaved"});
  expect_reason(sonicmoe_unsupported(bf16_spec(260, 124), DType::kBF16, kHopper), {"multiples of 8", "H = 260"});
  // The device comes first: a host is named before the experts' own problems.
  expect_reason(sonicmoe_unsupported(ungated, DType::kF32, kHost), {"no CUDA device"});
}

// A hand-built spec with static activation scales is refused by every backend (none of them
// reads activation scales from the weights), not run with dynamic ones.
TEST(StaticActivations, EveryBackendRefusesThem) {
  ExpertsSpec s = fp8_spec();
  s.quant.activations = QuantScheme::Activations::kStatic;
  const ExpertsWeights w = random_quantized_experts_weights(s, 5);
  const Routing r = random_routing(s, 3, 2, DType::kBF16, 6, RoutingCase::kRandom);
  for (const std::string name : {"eager", "batched_mm", "grouped_mm", "auto"}) {
    try {
      (void)experts_forward(name, s, w, r.hidden, r.top_k_index, r.top_k_weights);
      ADD_FAILURE() << name << " ran static activation scales";
    } catch (const Unsupported& e) {
      EXPECT_NE(std::string(e.what()).find("static"), std::string::npos) << name << ": " << e.what();
    }
  }
}

// As registered: on the host both names refuse clearly; with a CUDA build the names exist.
TEST(DeepGemmBackends, RefuseTheHostWithTheReason) {
  if (!has_experts_backend("deepgemm")) GTEST_SKIP() << "built without CUDA (the names need the CUDA build)";
  const ExpertsSpec s = bf16_spec();
  EXPECT_NE(get_experts_backend("deepgemm")->unsupported_reason(s, DType::kBF16, Device::cpu()).find("Hopper"),
            std::string::npos);
  EXPECT_NE(get_experts_backend("deepgemm_megamoe")->unsupported_reason(s, DType::kBF16, Device::cpu()).find("Blackwell"),
            std::string::npos);
  const BackendCaps c = get_experts_backend("deepgemm")->caps();
  EXPECT_EQ(c.dtypes, std::vector<DType>{DType::kBF16});
  EXPECT_TRUE(c.graph_capturable);
  EXPECT_TRUE(c.quantized_weights);
  EXPECT_FALSE(get_experts_backend("deepgemm_megamoe")->caps().graph_capturable);
  EXPECT_NE(get_experts_backend("sonicmoe")->unsupported_reason(s, DType::kBF16, Device::cpu()).find("Hopper"),
            std::string::npos);
  const BackendCaps sc = get_experts_backend("sonicmoe")->caps();
  EXPECT_EQ(sc.dtypes, (std::vector<DType>{DType::kBF16, DType::kF16}));
  EXPECT_TRUE(sc.graph_capturable);
  EXPECT_FALSE(sc.quantized_weights);
}

class DeepGemmCli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_req_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }
  std::string tmp_;
};

// A user asking for deepgemm where it cannot run: exit code 2, one stderr line with the reason.
TEST_F(DeepGemmCli, GenerateOnTheHostExitsTwoWithTheReason) {
  if (!has_experts_backend("deepgemm")) GTEST_SKIP() << "built without CUDA (the names need the CUDA build)";
  const std::string model = data_path("hf-tiny/qwen2_moe/checkpoint_bf16");
  for (const char* name : {"deepgemm", "deepgemm_megamoe", "sonicmoe"}) {
    const CliResult r = run_cli(std::string("generate --model ") + model +
                                    " --device cpu --dtype bfloat16 --prompt-ids 1,2,3 --max-new-tokens 2"
                                    " --experts-implementation " + name,
                                tmp_);
    EXPECT_EQ(r.exit_code, 2) << name << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("not on cpu"), std::string::npos) << r.err;
  }
}

TEST_F(DeepGemmCli, BackendsListsGraphAndQuantizedSupport) {
  const CliResult r = run_cli("backends", tmp_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("graph="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("quantized="), std::string::npos) << r.out;
  if (has_experts_backend("deepgemm")) {
    EXPECT_NE(r.out.find("deepgemm "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("deepgemm_megamoe"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("sonicmoe"), std::string::npos) << r.out;
  }
}

// backends --json: one row per registered backend, in the registry's order, each field what the
// backend's caps() say (the CLI of this build registers the same built-in backends as the test).
TEST_F(DeepGemmCli, BackendsJsonRowsAreTheRegistrysCaps) {
  const CliResult r = run_cli("backends --json", tmp_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<nlohmann::json> rows;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
  const std::vector<std::string> names = experts_backend_names();
  ASSERT_EQ(rows.size(), names.size()) << r.out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const BackendCaps c = get_experts_backend(names[i])->caps();
    EXPECT_EQ(rows[i]["name"], names[i]);
    EXPECT_EQ(rows[i]["graph_capturable"], c.graph_capturable) << names[i];
    EXPECT_EQ(rows[i]["quantized_weights"], c.quantized_weights) << names[i];
    EXPECT_EQ(rows[i]["devices"].size(), c.devices.size()) << names[i];
    ASSERT_EQ(rows[i]["dtypes"].size(), c.dtypes.size()) << names[i];
    for (size_t d = 0; d < c.dtypes.size(); ++d)
      EXPECT_EQ(rows[i]["dtypes"][d], std::string(dtype_name(c.dtypes[d]))) << names[i];
    EXPECT_EQ(rows[i]["description"], c.description) << names[i];
  }
  // eager is the one built-in backend a graph cannot capture; every backend lists a device.
  for (const auto& row : rows) {
    EXPECT_FALSE(row["devices"].empty()) << row.dump();
    if (row["name"] == "eager") EXPECT_FALSE(row["graph_capturable"].get<bool>());
  }
}

}  // namespace
