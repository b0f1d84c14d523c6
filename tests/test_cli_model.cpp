// The model commands of the CLI, run as a user would (MOEX_CLI_PATH): generate (one prompt and
// left-padded batches), logits (with and without an attention mask) and info against the
// transformers fixtures, and bad input answered by one clear error line and exit 2.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

using Result = test::CliResult;
using test::read_file;

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moex_cli_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }

  // Runs `moex ARGS` (ARGS already shell-quoted) and captures stdout and stderr separately.
  Result run(const std::string& args) { return test::run_cli(args, tmp_); }
  // A bad-input run: non-zero exit (not a crash), nothing on stdout, exactly one stderr line that
  // says "error" and contains `needle`.
  void expect_clean_error(const std::string& args, const std::string& needle) {
    Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    ASSERT_FALSE(r.err.empty()) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
  }

  static std::string model(const std::string& name, const std::string& ckpt = "checkpoint_fp32") {
    return test::data_path("hf-tiny/" + name + "/" + ckpt);
  }
  static std::shared_ptr<SafetensorsFile> reference(const std::string& name) {
    return SafetensorsFile::open(test::data_path("hf-tiny/" + name + "/reference.safetensors"));
  }

  std::string tmp_;
};

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

TEST_F(Cli, GenerateGreedyMatchesTransformersWithEveryBackend) {
  auto ref = reference("qwen2_moe");
  const auto greedy = ref->get("greedy_fp32").to_int_vector();
  const auto prompt = std::vector<int64_t>(greedy.begin(), greedy.begin() + 11);
  for (const char* backend : {"eager", "batched_mm", "grouped_mm"}) {
    const std::string out = tmp_ + "/seq.safetensors";
    Result r = run("generate --model " + model("qwen2_moe") + " --prompt-ids " + join(prompt) +
                   " --max-new-tokens 12 --greedy --experts-implementation " + backend + " --out " + out);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["sequences"][0].get<std::vector<int64_t>>(), greedy) << backend;
    EXPECT_EQ(j["experts_implementation"][""], backend);
    // What the decode steps ran: the same backend (the decode-stage switch applies on a GPU only).
    EXPECT_EQ(j["decode_experts_implementation"][""], backend);
    EXPECT_FALSE(j.contains("decode_switch_note")) << j.dump();
    EXPECT_EQ(j["new_tokens"], 12);
    Tensor seq = SafetensorsFile::open(out)->get("sequences");
    EXPECT_EQ(seq.dtype(), DType::kI64);
    EXPECT_EQ(seq.shape(), (Shape{1, 23}));
    EXPECT_EQ(seq.to_int_vector(), greedy);
  }
}

TEST_F(Cli, GenerateSamplingIsSeeded) {
  const std::string base = "generate --model " + model("mixtral") + " --prompt-ids 5,6,7 --max-new-tokens 8";
  const std::string sampling = base + " --temperature 0.9 --top-k 50 --top-p 0.95 --seed ";
  auto tokens = [&](const std::string& args) {
    Result r = run(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out)["sequences"][0].get<std::vector<int64_t>>()
                            : std::vector<int64_t>{};
  };
  const auto a = tokens(sampling + "11"), b = tokens(sampling + "11");
  ASSERT_EQ(a.size(), 11u);
  EXPECT_EQ(a, b) << "the same seed gave different samples";
  EXPECT_EQ(std::vector<int64_t>(a.begin(), a.begin() + 3), (std::vector<int64_t>{5, 6, 7}));
  // The seed and the sampling are used: another seed, and greedy decoding, give other tokens
  // (checked once on the fixture; with 8 tokens from a flat random model a match is chance).
  EXPECT_NE(a, tokens(sampling + "12")) << "--seed had no effect";
  EXPECT_NE(a, tokens(base + " --greedy")) << "sampling gave the greedy tokens";
}

// bf16 generation against transformers: its bf16 logits (reference.safetensors, the bf16
// checkpoint run in bf16) at the prompt's last position give the first generated token, and the
// fp32 greedy sequence that transformers recorded gives the rest, as far as bf16 follows it on
// this fixture (checked: the whole 12-token continuation).
TEST_F(Cli, GenerateBf16) {
  auto ref = reference("olmoe");
  const auto greedy = ref->get("greedy_fp32").to_int_vector();  // [1, 23]: 11 prompt + 12 new
  const std::vector<int64_t> prompt(greedy.begin(), greedy.begin() + 11);
  Result r = run("generate --model " + model("olmoe", "checkpoint_bf16") + " --prompt-ids " +
                 join(prompt) + " --max-new-tokens 12 --greedy --dtype bfloat16");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dtype"], "bfloat16");
  const auto seq = j["sequences"][0].get<std::vector<int64_t>>();
  ASSERT_EQ(seq.size(), greedy.size());
  // First new token: the argmax of transformers' bf16 logits for row 0 after the prompt.
  const Tensor logits = ref->get("logits_bf16_eager");  // [2, 11, vocab]
  const int64_t vocab = logits.size(2);
  const auto row = logits.slice(0, 0, 1).select(0, 0).select(0, 10).contiguous().to_float_vector();
  const int64_t first = int64_t(std::max_element(row.begin(), row.end()) - row.begin());
  ASSERT_LT(first, vocab);
  EXPECT_EQ(seq[11], first);
  EXPECT_EQ(seq, greedy);
}

// A prompt long enough for cuDNN's prompt attention has its graph planned on a builder thread
// (src/ops/cuda/attention_cudnn.cpp), and a short generation ends within that planning: the
// process must still exit 0 with its output, not die in a build torn down under it (SIGSEGV
// before the model waited for its builds). Several runs, since it is a race.
TEST_F(Cli, GenerateOnTheGpuExitsCleanlyWhileAttentionIsBeingPlanned) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<int64_t> prompt;
  for (int64_t t = 0; t < 160; ++t) prompt.push_back(1 + (t * 7) % 250);
  for (int run_index = 0; run_index < 3; ++run_index) {
    Result r = run("generate --model " + model("qwen2_moe", "checkpoint_bf16") + " --device cuda --dtype bfloat16" +
                   " --prompt-ids " + join(prompt) + " --max-new-tokens 2");
    ASSERT_EQ(r.exit_code, 0) << "run " << run_index << "\n" << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["sequences"][0].size(), prompt.size() + 2);
  }
}

TEST_F(Cli, LogitsMatchTransformers) {
  for (const char* name : {"qwen3_moe", "mixtral"}) {
    auto ref = reference(name);
    const std::string in = tmp_ + "/in.safetensors", out = tmp_ + "/out.safetensors";
    save_safetensors(in, {{"input_ids", ref->get("input_ids")}});
    Result r = run("logits --model " + model(name) + " --inputs " + in + " --out " + out +
                   " --experts-implementation batched_mm");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    Tensor logits = SafetensorsFile::open(out)->get("logits");
    EXPECT_EQ(logits.dtype(), DType::kF32);
    EXPECT_LE(test::rel_l2_error(logits, ref->get("logits_fp32_batched_mm")), 1e-4) << name;
  }
}

// --ep-size N: the model's experts split over N in-process ranks, rank 0 printing: the same
// greedy tokens as transformers in both modes (generate, and a text-free logits run), one clear
// error for an ep size that does not divide the experts, a bad mode, or a mode without a size.
TEST_F(Cli, ExpertParallelRanksGiveTransformersTokensAndLogits) {
  auto ref = reference("qwen2_moe");
  const auto greedy = ref->get("greedy_fp32").to_int_vector();
  const auto prompt = std::vector<int64_t>(greedy.begin(), greedy.begin() + 11);
  for (const char* mode : {"replicated", "all-to-all"}) {
    Result r = run("generate --model " + model("qwen2_moe") + " --prompt-ids " + join(prompt) +
                   " --max-new-tokens 12 --ep-size 2 --ep-mode " + mode);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["sequences"][0].get<std::vector<int64_t>>(), greedy) << mode;
  }
  auto mix = reference("mixtral");
  const std::string in = tmp_ + "/in.safetensors", out = tmp_ + "/out.safetensors";
  save_safetensors(in, {{"input_ids", mix->get("input_ids")}});
  Result r = run("logits --model " + model("mixtral") + " --inputs " + in + " --out " + out +
                 " --experts-implementation grouped_mm --ep-size 4 --ep-mode all-to-all");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one summary line, from the lead: " << r.out;
  EXPECT_LE(test::rel_l2_error(SafetensorsFile::open(out)->get("logits"), mix->get("logits_fp32_grouped_mm")), 1e-4);
  const std::string base = "generate --model " + model("mixtral") + " --prompt-ids 1,2,3 ";
  expect_clean_error(base + "--ep-size 3", "ep_size must divide the number of experts");
  expect_clean_error(base + "--ep-size 2 --ep-mode sideways", "--ep-mode must be replicated or all-to-all");
  expect_clean_error(base + "--ep-mode all-to-all", "--ep-mode needs --ep-size");
  expect_clean_error(base + "--ep-size 0", "--ep-size must be between 1 and 1024");
}

// --tp-size N: attention heads and dense columns split over N in-process ranks (alone, and with
// --ep-size N on the same ranks): transformers' greedy tokens; one clear error for sizes that
// disagree or heads the ranks do not divide.
TEST_F(Cli, TensorParallelRanksGiveTransformersTokens) {
  auto ref = reference("qwen2_moe");
  const auto greedy = ref->get("greedy_fp32").to_int_vector();
  const auto prompt = std::vector<int64_t>(greedy.begin(), greedy.begin() + 11);
  for (const char* sizes : {"--tp-size 2", "--tp-size 2 --ep-size 2"}) {
    Result r = run("generate --model " + model("qwen2_moe") + " --prompt-ids " + join(prompt) +
                   " --max-new-tokens 12 " + sizes);
    ASSERT_EQ(r.exit_code, 0) << sizes << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["sequences"][0].get<std::vector<int64_t>>(), greedy) << sizes;
  }
  const std::string base = "generate --model " + model("mixtral") + " --prompt-ids 1,2,3 ";
  expect_clean_error(base + "--tp-size 2 --ep-size 4", "--ep-size 4 and --tp-size 2 differ");
  expect_clean_error(base + "--tp-size 4", "num_key_value_heads (2) does not split into --tp-size 4");
  expect_clean_error(base + "--tp-size 0", "--tp-size must be between 1 and 1024");
}

// moex launch: N processes with RANK / LOCAL_RANK / WORLD_SIZE / MOEX_RENDEZVOUS (a stand-in
// program, MOEX_LAUNCH_PROGRAM, prints them); when one rank fails the others are stopped after
// the grace period and the launcher exits with the failed rank's code, naming it; launched ranks
// of a model command on the CPU are refused (one process per GPU), as is a launch without command.
TEST_F(Cli, LaunchStartsRanksAndStopsThemWhenOneFails) {
  struct ProgramEnv {
    ProgramEnv() { setenv("MOEX_LAUNCH_PROGRAM", "/bin/sh", 1); }
    ~ProgramEnv() { unsetenv("MOEX_LAUNCH_PROGRAM"); }
  };
  {
    ProgramEnv env;
    const std::string file = tmp_ + "/ranks.txt";
    Result r = run("launch --nproc 3 -- -c 'echo \"$RANK $LOCAL_RANK $WORLD_SIZE ${MOEX_RENDEZVOUS:+set}\" >> " + file + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> lines;
    std::istringstream in(test::read_file(file));
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    std::sort(lines.begin(), lines.end());
    EXPECT_EQ(lines, (std::vector<std::string>{"0 0 3 set", "1 1 3 set", "2 2 3 set"}));

    const auto start = std::chrono::steady_clock::now();
    r = run("launch --nproc 3 --grace 0.2 -- -c 'if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 120'");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << "the sleeping ranks were stopped";
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_NE(r.err.find("rank 1 of 3 failed (exit code 3)"), std::string::npos) << r.err;

    r = run("launch --nproc 2 --grace 0.2 -- -c 'if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 120'");
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("rank 0 of 2 failed (signal"), std::string::npos) << r.err;
  }
  // Model commands on launched CPU ranks: every rank refuses, the launcher reports exit code 2 and
  // prints the ranks' one error line once, naming them.
  Result r = run("launch --nproc 3 -- generate --model " + model("mixtral") + " --prompt-ids 1,2,3");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = r.err.find(what); at != std::string::npos; at = r.err.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("launched ranks run on GPUs"), 1u) << r.err;
  EXPECT_NE(r.err.find("ranks 0-2: moex generate: error: "), std::string::npos) << r.err;
  // Errors that differ keep a line each: rank 1 names an unknown command, ranks 0 and 2 an option.
  {
    struct ProgramEnv {
      ProgramEnv(const std::string& moex) { setenv("MOEX_LAUNCH_PROGRAM", "/bin/sh", 1), setenv("LAUNCHED_MOEX", moex.c_str(), 1); }
      ~ProgramEnv() { unsetenv("MOEX_LAUNCH_PROGRAM"), unsetenv("LAUNCHED_MOEX"); }
    } env(MOEX_CLI_PATH);
    r = run("launch --nproc 3 -- -c 'if [ \"$RANK\" = 1 ]; then exec \"$LAUNCHED_MOEX\" frobnicate; "
            "else exec \"$LAUNCHED_MOEX\" --frobnicate; fi'");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(count("unknown"), 2u) << r.err;
    EXPECT_NE(r.err.find("ranks 0, 2: moex: error: unknown option '--frobnicate'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("rank 1: moex: error: unknown command 'frobnicate'"), std::string::npos) << r.err;
  }
  expect_clean_error("launch --nproc 2", "missing the command to launch");
  expect_clean_error("launch --nproc 0 -- generate", "--nproc must be between 1 and 1024");
  expect_clean_error("launch --nproc 2 -- launch --nproc 2 -- generate", "cannot launch itself");
}

// Prompts of different lengths ("a;b;c"): left-padded with the model's pad token and masked, so
// each row, padding dropped, is what transformers generated for it in a padded batch
// (padded_reference.safetensors; qwen2_moe has no stop token, so every row runs all steps).
TEST_F(Cli, GeneratePaddedBatchMatchesTransformers) {
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/qwen2_moe/padded_reference.safetensors"));
  const Tensor ids = ref->get("input_ids"), mask = ref->get("attention_mask"), want = ref->get("greedy_fp32");
  const int64_t B = ids.size(0), T = ids.size(1), L = want.size(1);
  const auto id = ids.to_int_vector(), m = mask.to_int_vector(), w = want.to_int_vector();
  std::string prompts;
  std::vector<int64_t> pad;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> real;
    for (int64_t t = 0; t < T; ++t)
      if (m[size_t(b * T + t)]) real.push_back(id[size_t(b * T + t)]);
    pad.push_back(T - int64_t(real.size()));
    prompts += (b ? ";" : "") + join(real);
  }
  const std::string out = tmp_ + "/seq.safetensors";
  Result r = run("generate --model " + model("qwen2_moe") + " --prompt-ids '" + prompts + "' --max-new-tokens " +
                 std::to_string(L - T) + " --greedy --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["pad_token_id"], 0);  // qwen2_moe names no pad and no stop token
  EXPECT_EQ(j["pad_token_id_source"], "default 0 (no pad_token_id or eos_token_id)");
  EXPECT_EQ(j["padding"].get<std::vector<int64_t>>(), pad);
  EXPECT_EQ(j["prompt_tokens"], T);
  ASSERT_EQ(j["sequences"].size(), size_t(B));
  EXPECT_EQ(SafetensorsFile::open(out)->get("sequences").shape(), (Shape{B, L}));
  for (int64_t b = 0; b < B; ++b) {
    const auto row = j["sequences"][size_t(b)].get<std::vector<int64_t>>();
    ASSERT_EQ(int64_t(row.size()), L);
    EXPECT_EQ(std::vector<int64_t>(row.begin(), row.begin() + pad[size_t(b)]),
              std::vector<int64_t>(size_t(pad[size_t(b)]), 0)) << "row " << b << " padding";
    EXPECT_EQ(std::vector<int64_t>(row.begin() + pad[size_t(b)], row.end()),
              std::vector<int64_t>(w.begin() + b * L + pad[size_t(b)], w.begin() + (b + 1) * L))
        << "row " << b;
  }
}

// The pad token: generation_config.json's pad_token_id (olmoe: 1), else the first stop token
// (mixtral: 2); the JSON says which.
TEST_F(Cli, GeneratePadTokenSource) {
  for (const auto& [name, id, source] :
       {std::tuple<std::string, int64_t, std::string>{"olmoe", 1, "generation_config.json pad_token_id"},
        {"mixtral", 2, "eos_token_id"}}) {
    Result r = run("generate --model " + model(name) + " --prompt-ids '5,6,7;8' --max-new-tokens 1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["pad_token_id"], id) << name;
    EXPECT_EQ(j["pad_token_id_source"], source) << name;
    const auto row = j["sequences"][1].get<std::vector<int64_t>>();
    EXPECT_EQ(std::vector<int64_t>(row.begin(), row.begin() + 3), (std::vector<int64_t>{id, id, 8})) << name;
  }
}

// `moex logits` with an attention_mask in the inputs file: transformers' padded batch.
TEST_F(Cli, LogitsWithAttentionMaskMatchTransformers) {
  auto ref = SafetensorsFile::open(test::data_path("hf-tiny/gpt_oss/padded_reference.safetensors"));
  const std::string in = tmp_ + "/in.safetensors", out = tmp_ + "/out.safetensors";
  const Tensor mask = ref->get("attention_mask");
  save_safetensors(in, {{"input_ids", ref->get("input_ids")}, {"attention_mask", mask}});
  Result r = run("logits --model " + model("gpt_oss") + " --inputs " + in + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["attention_mask"], true);
  // Real positions only (transformers' padding rows are its own).
  const auto got = SafetensorsFile::open(out)->get("logits").to_float_vector();
  const auto want = ref->get("logits_fp32").to_float_vector();
  const auto m = mask.to_int_vector();
  const size_t V = want.size() / m.size();
  std::vector<float> a, b;
  for (size_t i = 0; i < m.size(); ++i)
    if (m[i]) {
      a.insert(a.end(), got.begin() + int64_t(i * V), got.begin() + int64_t((i + 1) * V));
      b.insert(b.end(), want.begin() + int64_t(i * V), want.begin() + int64_t((i + 1) * V));
    }
  const int64_t rows = int64_t(a.size() / V);
  EXPECT_LE(test::rel_l2_error(Tensor::from_floats(a, {rows, int64_t(V)}), Tensor::from_floats(b, {rows, int64_t(V)})),
            1e-5);
}

TEST_F(Cli, InfoReportsTheModelAndTheExpertsMap) {
  Result r = run("info --model " + model("qwen3_vl_moe") + " --experts-implementation '{\"\": \"batched_mm\"}'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model_type"], "qwen3_vl_moe");
  EXPECT_EQ(j["architecture"], "Qwen3VLMoeForConditionalGeneration");
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_GT(j["parameter_count"].get<int64_t>(), 0);
  EXPECT_EQ(j["moe_layers"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(j["experts_implementation"],
            nlohmann::json({{"", "batched_mm"}, {"text_config", "batched_mm"}, {"vision_config", "batched_mm"}}));

  r = run("info --model " + model("qwen2_moe", "checkpoint_bf16"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dtype"], "bfloat16");
  EXPECT_EQ(j["experts_implementation"], nlohmann::json({{"", "grouped_mm"}}));
}

TEST_F(Cli, BadInputGivesOneClearError) {
  const std::string q2 = " --model " + model("qwen2_moe");
  expect_clean_error("generate" + q2 + " --prompt-ids 1,2,256", "token id 256 at input_ids[0, 2]");
  expect_clean_error("generate" + q2 + " --prompt-ids ''", "empty prompt");
  expect_clean_error("generate" + q2 + " --prompt-ids 1 --experts-implementation fastest", "fastest");
  expect_clean_error("generate --model " + model("qwen3_vl_moe") +
                         " --prompt-ids 1 --experts-implementation '{\"audio_config\": \"eager\"}'",
                     "audio_config");
  expect_clean_error("info" + q2 + " --experts-implementation '{\"text_config\": \"eager\"}'", "text_config");
  expect_clean_error("generate" + q2 + " --prompt-ids 1 --device cuda:99", "cuda:99");
  expect_clean_error("generate" + q2 + " --prompt-ids 1 --greedy --seed 3", "--greedy");
  expect_clean_error("generate" + q2 + " --prompt-ids 1,x", "invalid integer 'x'");
  expect_clean_error("generate" + q2 + " --prompt-ids '1,2;'", "empty sequence 1");
  expect_clean_error("generate" + q2 + " --prompt-ids ';1,2'", "empty sequence 0");
  expect_clean_error("generate" + q2 + " --prompt-ids '1,2;3,y'", "'y'");
  expect_clean_error("generate" + q2 + " --prompt-ids '1,2;3,,4'", "empty id");
  expect_clean_error("generate" + q2 + " --prompt-ids '1,2;300'", "token id 300 at input_ids[1, 1]");

  // Unknown model_type: a folder whose config names an architecture moex does not have.
  const std::string dir = tmp_ + "/unknown";
  std::filesystem::create_directory(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama4_moe"})";
  std::filesystem::copy_file(model("qwen2_moe") + "/model.safetensors", dir + "/model.safetensors");
  expect_clean_error("info --model " + dir, "llama4_moe");

  // logits: token ids out of range, and an inputs file without input_ids.
  const std::string in = tmp_ + "/bad.safetensors";
  save_safetensors(in, {{"input_ids", Tensor::from_ints({1, 2, 999}, {1, 3})}});
  expect_clean_error("logits" + q2 + " --inputs " + in + " --out " + tmp_ + "/o.safetensors", "999");
  save_safetensors(in, {{"tokens", Tensor::from_ints({1, 2}, {1, 2})}});
  expect_clean_error("logits" + q2 + " --inputs " + in + " --out " + tmp_ + "/o.safetensors", "input_ids");
  // logits: an attention_mask that is right padding, or of another shape.
  save_safetensors(in, {{"input_ids", Tensor::from_ints({1, 2, 3, 4}, {2, 2})},
                        {"attention_mask", Tensor::from_ints({1, 1, 1, 0}, {2, 2})}});
  expect_clean_error("logits" + q2 + " --inputs " + in + " --out " + tmp_ + "/o.safetensors",
                     "attention_mask row 1 is not left padding");
  save_safetensors(in, {{"input_ids", Tensor::from_ints({1, 2, 3, 4}, {2, 2})},
                        {"attention_mask", Tensor::from_ints({1, 1}, {1, 2})}});
  expect_clean_error("logits" + q2 + " --inputs " + in + " --out " + tmp_ + "/o.safetensors", "shape");
}

}  // namespace
}  // namespace moex
