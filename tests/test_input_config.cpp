// Bad config.json / generation_config.json values and bad weights: each is one clear error that
// names the key (or tensor) and the file, raised before any large allocation, never a crash, a
// hang or silently wrong logits. The checkpoints are the tiny fixtures with one value changed.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "moex/checkpoint.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

class BadConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_badcfg_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { fs::remove_all(tmp_); }

  static std::string source(const std::string& model) {
    return test::data_path("hf-tiny/" + model + "/checkpoint_fp32");
  }
  static Json read_json(const std::string& path) { return Json::parse(test::read_file(path)); }

  // A copy of a fixture whose config.json (and generation_config.json) `edit` changed; the
  // weights are links to the fixture's.
  std::string variant(const std::string& model, const std::function<void(Json& config, Json& gen)>& edit) {
    const std::string src = source(model), dir = tmp_ + "/" + model + std::to_string(count_++);
    fs::create_directory(dir);
    Json config = read_json(src + "/config.json");
    Json gen = fs::exists(src + "/generation_config.json") ? read_json(src + "/generation_config.json") : Json::object();
    edit(config, gen);
    std::ofstream(dir + "/config.json") << config.dump();
    std::ofstream(dir + "/generation_config.json") << gen.dump();
    fs::create_symlink(src + "/model.safetensors", dir + "/model.safetensors");
    return dir;
  }
  // The language model's config object (text_config for qwen3_vl_moe).
  static Json& text(Json& c) { return c.contains("text_config") ? c["text_config"] : c; }

  // from_pretrained(dir) must throw E whose message contains every needle.
  template <class E = InvalidInput>
  void expect_load_error(const std::string& dir, const std::vector<std::string>& needles) {
    try {
      from_pretrained(dir);
      ADD_FAILURE() << dir << ": expected an error containing '" << needles[0] << "'";
    } catch (const E& e) {
      for (const auto& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "expected '" << n << "' in: " << e.what();
    }
  }

  std::string tmp_;
  int count_ = 0;
};

// Peak resident memory of this process, in MB.
double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

const char* const kSparseModels[] = {"qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "qwen3_vl_moe"};

// Every sparse_step-th layer is a MoE layer: 0 divided by zero (SIGFPE) in every qwen model.
TEST_F(BadConfig, DecoderSparseStepZeroIsAnErrorInEveryQwenArchitecture) {
  for (const char* model : {"qwen2_moe", "qwen3_moe", "qwen3_vl_moe"})
    for (int step : {0, -2}) {
      SCOPED_TRACE(std::string(model) + " step " + std::to_string(step));
      expect_load_error(variant(model, [&](Json& c, Json&) { text(c)["decoder_sparse_step"] = step; }),
                        {"decoder_sparse_step must be >= 1", "config.json"});
    }
}

// head_dim sizes the rope table before any attention weight is read: a wrong one must be
// reported as the tensor that disagrees, at once, without allocating gigabytes.
TEST_F(BadConfig, HugeHeadDimFailsFastNamingTheTensor) {
  for (const char* model : {"qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "qwen3_vl_moe", "gpt_oss"}) {
    SCOPED_TRACE(model);
    const std::string dir = variant(model, [](Json& c, Json&) { text(c)["head_dim"] = 1000000000; });
    const double rss = peak_rss_mb();
    const auto t0 = std::chrono::steady_clock::now();
    expect_load_error(dir, {"self_attn.q_proj.weight", "has shape", "config.json"});
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    EXPECT_LT(peak_rss_mb() - rss, 200.0);
  }
  const std::string ds = variant("deepseek_v3", [](Json& c, Json&) { c["qk_rope_head_dim"] = 1000000000; });
  expect_load_error(ds, {"self_attn.", "has shape", "config.json"});
}

TEST_F(BadConfig, OverflowingHeadDimIsAnError) {
  const std::string dir =
      variant("qwen3_moe", [](Json& c, Json&) { c["head_dim"] = int64_t(1) << 62; });
  expect_load_error(dir, {"head_dim", "overflows"});
}

// The fused experts buffer is E x 2I x H: the experts' shapes are checked before it exists.
TEST_F(BadConfig, HugeIntermediateSizeFailsFastNamingTheTensor) {
  const std::map<std::string, std::string> key = {{"qwen2_moe", "moe_intermediate_size"},
                                                  {"qwen3_moe", "moe_intermediate_size"},
                                                  {"mixtral", "intermediate_size"},
                                                  {"olmoe", "intermediate_size"},
                                                  {"qwen3_vl_moe", "moe_intermediate_size"},
                                                  {"deepseek_v3", "moe_intermediate_size"}};
  for (const auto& [model, k] : key) {
    SCOPED_TRACE(model);
    const std::string dir = variant(model, [&](Json& c, Json&) { text(c)[k] = 1000000000; });
    const double rss = peak_rss_mb();
    const auto t0 = std::chrono::steady_clock::now();
    expect_load_error(dir, {".experts.", "has shape", "config.json"});
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    EXPECT_LT(peak_rss_mb() - rss, 200.0);
  }
}

TEST_F(BadConfig, MoreLayersThanTheCheckpointIsAnError) {
  for (const char* model : {"qwen3_moe", "qwen3_vl_moe", "deepseek_v3", "gpt_oss"}) {
    SCOPED_TRACE(model);
    const std::string dir = variant(model, [](Json& c, Json&) { text(c)["num_hidden_layers"] = 1000000000000LL; });
    const auto t0 = std::chrono::steady_clock::now();
    expect_load_error(dir, {"num_hidden_layers is 1000000000000", "input_layernorm.weight"});
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  }
}

TEST_F(BadConfig, WrongJsonTypesNameTheKeyAndTheType) {
  struct Case {
    const char* key;
    Json value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"hidden_size", "128", "key 'hidden_size' must be an integer, got string"},
      {"rms_norm_eps", "tiny", "key 'rms_norm_eps' must be a number, got string"},
      {"tie_word_embeddings", "yes", "key 'tie_word_embeddings' must be true or false, got string"},
      {"mlp_only_layers", "none", "key 'mlp_only_layers' must be a list of layer indices, got string"},
      {"mlp_only_layers", Json::array({"1"}), "key 'mlp_only_layers' must be a list of layer indices"},
      {"dtype", 32, "key 'dtype' must be a string, got integer"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key);
    expect_load_error(variant("qwen3_moe", [&](Json& j, Json&) { j[c.key] = c.value; }), {c.message, "config.json"});
  }
}

// Each of these used to fall back to a default (exit 0, plausible logits) or give NaN logits.
TEST_F(BadConfig, BadRopeValuesAreErrorsNamingTheKey) {
  struct Case {
    std::function<void(Json&)> edit;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {[](Json& c) { c["rope_parameters"]["rope_theta"] = "1e4"; }, "'rope_parameters.rope_theta' must be a number, got string"},
      {[](Json& c) { c["rope_parameters"] = "default"; }, "'rope_parameters' must be an object, got string"},
      {[](Json& c) { c["rope_parameters"] = Json::array(); }, "'rope_parameters' must be an object, got array"},
      {[](Json& c) { c["rope_parameters"]["rope_type"] = 1; }, "'rope_parameters.rope_type' must be a string, got integer"},
      {[](Json& c) { c["rope_parameters"]["rope_theta"] = 0; }, "'rope_parameters.rope_theta' must be > 0"},
      {[](Json& c) { c["rope_parameters"]["rope_theta"] = -10000.0; }, "'rope_parameters.rope_theta' must be > 0"},
      {[](Json& c) {
         c["rope_parameters"]["rope_type"] = "linear";
         c["rope_parameters"]["factor"] = 0;
       },
       "'rope_parameters.factor' must be > 0"},
      {[](Json& c) {
         c.erase("rope_parameters");
         c["rope_theta"] = true;
       },
       "'rope_theta' must be a number, got boolean"},
      {[](Json& c) { c["rope_scaling"] = 3; }, "'rope_scaling' must be an object, got integer"},
      {[](Json& c) { c["rms_norm_eps"] = -1e-6; }, "rms_norm_eps must be >= 0"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    expect_load_error(variant("qwen3_moe", [&](Json& c, Json&) { cases[i].edit(c); }), {cases[i].needle, "config.json"});
  }
  // gpt-oss fills in its own rope defaults: a bad value must not be replaced by them.
  expect_load_error(variant("gpt_oss", [](Json& c, Json&) { c["rope_parameters"] = "yarn"; }),
                    {"'rope_parameters' must be an object"});
  expect_load_error(variant("gpt_oss", [](Json& c, Json&) { c["rope_parameters"]["rope_theta"] = "x"; }),
                    {"'rope_parameters.rope_theta' must be a number"});
  expect_load_error(variant("gpt_oss", [](Json& c, Json&) { c["rope_parameters"]["truncate"] = "no"; }),
                    {"'rope_parameters.truncate' must be true or false"});
  // Values the formulas cannot take: a window of no keys, a negative clamp, a negative window.
  expect_load_error(variant("gpt_oss", [](Json& c, Json&) { c["sliding_window"] = 0; }),
                    {"sliding_window must be >= 1, got 0"});
  // Absent, the window is 0 (none), as before: the model loads.
  EXPECT_EQ(from_pretrained(variant("gpt_oss", [](Json& c, Json&) { c.erase("sliding_window"); }))->info().model_type,
            "gpt_oss");
  expect_load_error(variant("gpt_oss", [](Json& c, Json&) { c["swiglu_limit"] = -1.0; }),
                    {"swiglu_limit must be > 0"});
  expect_load_error(variant("qwen3_moe", [](Json& c, Json&) { c["sliding_window"] = -5; }),
                    {"sliding_window must be >= 0, got -5"});
  expect_load_error(variant("deepseek_v3", [](Json& c, Json&) { c["routed_scaling_factor"] = -1.0; }),
                    {"routed_scaling_factor must be > 0"});
}

TEST_F(BadConfig, EosTokenIdOfTheWrongTypeIsAnError) {
  for (const Json& bad : {Json("2"), Json(2.5), Json::array({Json::array({1})}), Json::array({1, "a"}), Json::object()}) {
    SCOPED_TRACE(bad.dump());
    expect_load_error(variant("mixtral", [&](Json&, Json& g) { g["eos_token_id"] = bad; }),
                      {"generation_config.json: key 'eos_token_id' must be an integer or a list of integers"});
    expect_load_error(variant("qwen3_moe", [&](Json& c, Json&) { c["eos_token_id"] = bad; }),
                      {"config.json: key 'eos_token_id' must be an integer or a list of integers"});
  }
  // The accepted forms.
  auto lm = from_pretrained(variant("qwen3_moe", [](Json&, Json& g) { g["eos_token_id"] = Json::array({3, 5}); }));
  EXPECT_EQ(lm->default_eos_token_ids(), (std::vector<int64_t>{3, 5}));
}

TEST_F(BadConfig, SequencesLongerThanMaxPositionEmbeddingsAreRefused) {
  auto lm = from_pretrained(variant("qwen3_moe", [](Json& c, Json&) { c["max_position_embeddings"] = 8; }));
  EXPECT_EQ(lm->info().max_position_embeddings, 8);
  std::vector<int64_t> ids(9, 3);
  try {
    lm->logits(Tensor::from_ints(ids, {1, 9}));
    FAIL() << "expected an error";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("max_position_embeddings"), std::string::npos) << e.what();
  }
  EXPECT_EQ(lm->logits(Tensor::from_ints({1, 2, 3, 4, 5, 6, 7, 8}, {1, 8})).size(1), 8);
  GenerationOptions g;
  g.max_new_tokens = 5;
  const Tensor prompt = Tensor::from_ints({1, 2, 3, 4}, {1, 4});
  EXPECT_THROW(lm->generate(prompt, g), InvalidInput);
  g.max_new_tokens = std::numeric_limits<int64_t>::max();  // the sum must not wrap around
  EXPECT_THROW(lm->generate(prompt, g), InvalidInput);
  g.max_new_tokens = 4;
  EXPECT_NO_THROW(lm->generate(prompt, g));
  g.max_new_tokens = 6;
  g.allow_beyond_max_positions = true;
  g.eos_token_ids = std::vector<int64_t>{};
  EXPECT_EQ(lm->generate(prompt, g).size(1), 10);
}

// Weights that overflow give NaN logits: an error, not tokens chosen from NaN.
TEST_F(BadConfig, NonFiniteLogitsAreAnError) {
  auto src = Checkpoint::open(source("qwen3_moe"));
  std::map<std::string, Tensor> tensors;
  for (const auto& n : src->names()) tensors[n] = src->get(n);
  const Tensor norm = tensors.at("model.norm.weight");
  std::vector<float> v = norm.to_float_vector();
  v[3] = std::numeric_limits<float>::quiet_NaN();
  tensors["model.norm.weight"] = Tensor::from_floats(v, norm.shape());
  const std::string dir = tmp_ + "/nan";
  fs::create_directory(dir);
  fs::copy_file(source("qwen3_moe") + "/config.json", dir + "/config.json");
  save_safetensors(dir + "/model.safetensors", tensors);
  auto lm = from_pretrained(dir);
  const Tensor ids = Tensor::from_ints({1, 2, 3}, {1, 3});
  try {
    lm->logits(ids);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite logit"), std::string::npos) << e.what();
  }
  GenerationOptions g;
  g.max_new_tokens = 3;
  EXPECT_THROW(lm->generate(ids, g), Error);
  // On a GPU the logits never reach the host: the token choice counts them.
  if (moex::test::cuda_devices() > 0) {
    LoadOptions o;
    o.device = Device::cuda();
    auto gpu = from_pretrained(dir, o);
    try {
      gpu->generate(ids, g);
      FAIL() << "expected an error on CUDA";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("non-finite logit"), std::string::npos) << e.what();
    }
  }
}

TEST(CheckedSizes, ShapesThatOverflowAreErrors) {
  const int64_t big = int64_t(1) << 40;
  EXPECT_THROW(shape_numel({big, big}), InvalidInput);
  EXPECT_THROW(shape_numel({3, -1}), InvalidInput);
  EXPECT_THROW(Tensor::empty({big, big}, DType::kF32), InvalidInput);
  // Fits int64 in elements, not in bytes.
  EXPECT_THROW(Tensor::empty({int64_t(1) << 60, 4}, DType::kF32), InvalidInput);
  EXPECT_THROW(Tensor::zeros({big, big}, DType::kBF16), InvalidInput);
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({0, big, big}), 0);
}

}  // namespace
}  // namespace moex
