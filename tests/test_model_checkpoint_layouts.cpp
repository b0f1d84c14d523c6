// Checkpoint layouts a model must accept: tied embeddings (no lm_head.weight), experts already
// fused on disk (gate_up_proj / down_proj) instead of one tensor per expert, a float32
// checkpoint converted to bf16 at load (bit-identical to transformers' own bf16 checkpoint), and
// tensors the model does not use (listed and noted, not an error).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moex/checkpoint.hpp"
#include "moex/comm.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

class Layouts : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_layouts_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }

  // Writes a checkpoint folder with `tensors` and `config`.
  std::string write(const std::string& name, const std::map<std::string, Tensor>& tensors,
                    const nlohmann::json& config) {
    const std::string dir = tmp_ + "/" + name;
    std::filesystem::create_directory(dir);
    std::ofstream(dir + "/config.json") << config.dump();
    save_safetensors(dir + "/model.safetensors", tensors);
    return dir;
  }
  static std::map<std::string, Tensor> all_tensors(const Checkpoint& c) {
    std::map<std::string, Tensor> m;
    for (const auto& n : c.names()) m[n] = c.get(n);
    return m;
  }
  static Tensor ids() { return Tensor::from_ints({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, {2, 6}); }

  std::string tmp_;
};

TEST_F(Layouts, TiedEmbeddingsUseTheEmbeddingAsLmHead) {
  auto src = Checkpoint::open(test::data_path("hf-tiny/qwen3_moe/checkpoint_fp32"));
  auto tensors = all_tensors(*src);
  // Reference: an untied checkpoint whose lm_head is a copy of the embedding.
  tensors["lm_head.weight"] = tensors.at("model.embed_tokens.weight");
  const std::string untied = write("untied", tensors, src->config());
  tensors.erase("lm_head.weight");
  nlohmann::json cfg = src->config();
  cfg["tie_word_embeddings"] = true;
  const std::string tied = write("tied", tensors, cfg);
  Tensor a = from_pretrained(tied)->logits(ids()), b = from_pretrained(untied)->logits(ids());
  EXPECT_EQ(a.to_float_vector(), b.to_float_vector());
  // Without the tie flag a missing lm_head is an error naming the tensor.
  cfg["tie_word_embeddings"] = false;
  const std::string broken = write("broken", tensors, cfg);
  try {
    from_pretrained(broken);
    FAIL() << "expected a missing-tensor error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
  }
}

TEST_F(Layouts, PreFusedExpertsGiveTheSameLogits) {
  auto src = Checkpoint::open(test::data_path("hf-tiny/olmoe/checkpoint_fp32"));
  const nlohmann::json& cfg = src->config();
  const int64_t E = cfg["num_experts"], H = cfg["hidden_size"], I = cfg["intermediate_size"];
  std::map<std::string, Tensor> tensors;
  for (const auto& n : src->names())
    if (n.find(".experts.") == std::string::npos) tensors[n] = src->get(n);
  for (int64_t l = 0; l < cfg["num_hidden_layers"].get<int64_t>(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts";
    Tensor gu = Tensor::empty({E, 2 * I, H}, DType::kF32), dn = Tensor::empty({E, H, I}, DType::kF32);
    for (int64_t e = 0; e < E; ++e) {
      const std::string q = p + "." + std::to_string(e) + ".";
      auto g = src->get(q + "gate_proj.weight").to_float_vector(), u = src->get(q + "up_proj.weight").to_float_vector(),
           d = src->get(q + "down_proj.weight").to_float_vector();
      std::copy(g.begin(), g.end(), gu.data<float>() + e * 2 * I * H);
      std::copy(u.begin(), u.end(), gu.data<float>() + (e * 2 + 1) * I * H);
      std::copy(d.begin(), d.end(), dn.data<float>() + e * H * I);
    }
    tensors[p + ".gate_up_proj"] = gu;
    tensors[p + ".down_proj"] = dn;
  }
  const std::string fused = write("fused", tensors, cfg);
  LoadOptions o;
  o.experts_implementation = {{"", "eager"}};
  Tensor a = from_pretrained(fused, o)->logits(ids());
  Tensor b = from_pretrained(test::data_path("hf-tiny/olmoe/checkpoint_fp32"), o)->logits(ids());
  EXPECT_EQ(a.to_float_vector(), b.to_float_vector());
  // Expert parallelism slices each rank's experts out of the fused tensors (float32 as stored, and
  // converted to bfloat16 at load): two ranks give one process's logits (bfloat16: each rank's
  // partial output rounded once more, 3e-3 measured) and hold half the bytes.
  for (DType dt : {DType::kF32, DType::kBF16}) {
    LoadOptions one = o;
    one.dtype = dt;
    auto single = from_pretrained(fused, one);
    const Tensor want = single->logits(ids());
    auto comms = make_thread_group(2);
    std::vector<Tensor> got(2);
    std::vector<int64_t> bytes(2);
    test::expect_no_rank_errors(run_ranks(comms, [&](Communicator& c) {
      LoadOptions r = one;
      r.ep_comm = &c;
      auto lm = from_pretrained(fused, r);
      got[size_t(c.rank())] = lm->logits(ids());
      bytes[size_t(c.rank())] = lm->info().experts_weight_bytes;
    }));
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(got[size_t(rank)].defined());
      EXPECT_LE(test::rel_l2_error(got[size_t(rank)], want), dt == DType::kF32 ? 1e-5 : 1e-2)
          << dtype_name(dt) << " rank " << rank;
      EXPECT_EQ(2 * bytes[size_t(rank)], single->info().experts_weight_bytes) << dtype_name(dt);
    }
  }
}

TEST_F(Layouts, Fp32CheckpointLoadedAsBf16EqualsTheBf16Checkpoint) {
  // The fixtures' bf16 checkpoint is the fp32 one rounded by torch (nearest even), so converting
  // at load must give the very same weights and therefore identical logits.
  LoadOptions o;
  o.dtype = DType::kBF16;
  Tensor a = from_pretrained(test::data_path("hf-tiny/mixtral/checkpoint_fp32"), o)->logits(ids());
  Tensor b = from_pretrained(test::data_path("hf-tiny/mixtral/checkpoint_bf16"), o)->logits(ids());
  EXPECT_EQ(a.to_float_vector(), b.to_float_vector());
}

// A MoE-layer step of 0 (every step-th layer is a MoE layer) is refused with the key's name
// instead of dividing by zero (it used to kill the process with SIGFPE).
TEST_F(Layouts, DecoderSparseStepZeroIsAnError) {
  for (const char* model : {"qwen2_moe", "qwen3_moe"}) {
    auto src = Checkpoint::open(test::data_path(std::string("hf-tiny/") + model + "/checkpoint_fp32"));
    for (int step : {0, -2}) {
      nlohmann::json cfg = src->config();
      cfg["decoder_sparse_step"] = step;
      const std::string dir = write(std::string(model) + "_step" + std::to_string(step + 2),
                                    all_tensors(*src), cfg);
      try {
        from_pretrained(dir);
        FAIL() << model << ": expected an error for decoder_sparse_step " << step;
      } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("decoder_sparse_step"), std::string::npos) << e.what();
      }
    }
  }
}

// Every tensor of every fixture checkpoint (float32, bfloat16, FP8 / FP4 kept quantized or
// dequantized) is used by its load: the list of unused ones is empty, so the note below never
// fires on a checkpoint transformers uses whole.
TEST_F(Layouts, EveryFixtureTensorIsUsed) {
  for (const char* model : {"qwen2_moe", "mixtral", "olmoe", "qwen3_moe", "deepseek_v3", "gpt_oss"})
    for (const char* ckpt : {"checkpoint_fp32", "checkpoint_bf16"}) {
      const auto lm = from_pretrained(test::data_path(std::string("hf-tiny/") + model + "/" + ckpt));
      EXPECT_TRUE(lm->info().unused_tensors.empty()) << model << " " << ckpt << ": "
                                                     << lm->info().unused_tensors.front();
    }
  // The vision tower is left unread on purpose, and is not listed.
  EXPECT_TRUE(from_pretrained(test::data_path("hf-tiny/qwen3_vl_moe/checkpoint_fp32"))->info().unused_tensors.empty());
  for (const char* fixture : {"deepseek_v3_fp8_float", "deepseek_v3_fp8_ue8m0", "deepseek_v3_fp4_experts_ue8m0"})
    for (bool dequantize : {false, true}) {
      LoadOptions o;
      o.dequantize = dequantize;
      const auto lm = from_pretrained(test::data_path(std::string("hf-tiny/") + fixture + "/checkpoint"), o);
      EXPECT_TRUE(lm->info().unused_tensors.empty()) << fixture << " " << lm->info().unused_tensors.front();
    }
}

// Tensors the model does not use (a layer past num_hidden_layers, as DeepSeek-V3's
// multi-token-prediction layer; a stray name) load as before, are listed in ModelInfo and
// `moex info`, and the CLI's model commands say so in one line on stderr.
TEST_F(Layouts, UnusedTensorsAreListedAndNoted) {
  auto src = Checkpoint::open(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"));
  auto tensors = all_tensors(*src);
  tensors["model.layers.99.mlp.gate.weight"] = tensors.at("model.layers.0.mlp.gate.weight");
  tensors["mtp.head.weight"] = tensors.at("lm_head.weight");
  const std::string dir = write("extra", tensors, src->config());
  const auto lm = from_pretrained(dir);
  EXPECT_EQ(lm->info().unused_tensors, (std::vector<std::string>{"model.layers.99.mlp.gate.weight", "mtp.head.weight"}));
  EXPECT_EQ(lm->logits(ids()).to_float_vector(),
            from_pretrained(test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32"))->logits(ids()).to_float_vector());

  const auto gen = test::run_cli("generate --model " + dir + " --prompt-ids 1,2,3 --max-new-tokens 2", tmp_);
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_EQ(gen.err,
            "moex: note: 2 tensors of the checkpoint were not used: model.layers.99.mlp.gate.weight, "
            "mtp.head.weight (moex info lists them)\n");
  const auto info = test::run_cli("info --model " + dir, tmp_);
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_EQ(nlohmann::json::parse(info.out)["unused_tensors"],
            nlohmann::json({"model.layers.99.mlp.gate.weight", "mtp.head.weight"}));
  // Every tensor used: no note.
  const auto clean = test::run_cli(
      "generate --model " + test::data_path("hf-tiny/qwen2_moe/checkpoint_fp32") + " --prompt-ids 1,2,3 --max-new-tokens 2",
      tmp_);
  EXPECT_EQ(clean.exit_code, 0);
  EXPECT_EQ(clean.err, "");
}

}  // namespace
}  // namespace moex
