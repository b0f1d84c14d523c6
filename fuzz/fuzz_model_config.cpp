// libFuzzer target for the model side of config.json: from_pretrained on a tiny checkpoint of
// the test fixtures (tests/data/hf-tiny) with a fuzzed config.json (and generation_config.json),
// so that the decoder fields, the rope parameters, the shape checks against the headers, the
// experts layout and the stop tokens are all read from hostile values; then, when the model
// loads, logits for three tokens.
//
// Input: "config.json bytes, a NUL byte, generation_config.json bytes" (as fuzz_checkpoint_config).
// The weights are those of the fixture whose name the config text mentions first (qwen3_moe by
// default), so a fuzzed model_type usually meets weights of its own architecture.
// Loading and the forward must succeed or throw a moex::Error (InvalidInput, Unsupported,
// UnknownName, or Error for non-finite logits); any other exception (a raw JSON-library error,
// std::bad_alloc), a sanitizer finding, an allocation over libFuzzer's -malloc_limit_mb (a
// config value sizing an allocation before it was checked) or a hang is a failure.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "fuzz_folder.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"

namespace {

constexpr const char* kModels[] = {"qwen2_moe", "qwen3_vl_moe", "qwen3_moe", "mixtral", "olmoe",
                                   "deepseek_v3", "gpt_oss"};

// One folder per fixture, its weights linked, made once per process.
std::string folder(const std::string& model) {
  const std::string dir = moex::fuzz::scratch_dir() + "/" + model;
  if (!std::filesystem::exists(dir)) {
    std::filesystem::create_directory(dir);
    std::filesystem::create_symlink(std::string(MOEX_FUZZ_FIXTURES) + "/" + model + "/checkpoint_fp32/model.safetensors",
                                    dir + "/model.safetensors");
  }
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t config_len = nul ? size_t(nul - data) : size;
  const std::string_view config(reinterpret_cast<const char*>(data), config_len);
  std::string model = "qwen3_moe";
  size_t first = std::string_view::npos;
  for (const char* m : kModels)
    if (const size_t at = config.find(m); at < first) first = at, model = m;
  const std::string dir = folder(model);
  moex::fuzz::write_file(dir + "/config.json", data, config_len);
  const std::string gen = dir + "/generation_config.json";
  if (nul) moex::fuzz::write_file(gen, nul + 1, size - config_len - 1);
  else std::remove(gen.c_str());
  try {
    auto lm = moex::from_pretrained(dir);
    const int64_t V = lm->info().vocab_size;
    lm->logits(moex::Tensor::from_ints({0, 1 % V, 2 % V}, {1, 3}));
  } catch (const moex::Error&) {
  }
  return 0;
}
