// libFuzzer target for config.json (and generation_config.json) as Checkpoint::open reads them:
// the strict JSON parser (duplicate keys, nesting cap) and the checks on what it returns.
//
// Each input is "config.json bytes, a NUL byte, generation_config.json bytes" (without a NUL there
// is no generation_config.json), written into a scratch folder beside a small valid
// model.safetensors. Opening must succeed or throw moex::InvalidInput; an opened checkpoint must
// hold JSON objects and answer model_type() with a string or InvalidInput. Any other exception
// escapes, and libFuzzer reports it as a crash.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_folder.hpp"
#include "moex/checkpoint.hpp"
#include "moex/error.hpp"
#include "moex/safetensors.hpp"

namespace {

const std::string& folder() {
  static const std::string dir = [] {
    const std::string d = moex::fuzz::scratch_dir();
    moex::save_safetensors(d + "/model.safetensors",
                           {{"w", moex::Tensor::from_floats({1, 2, 3, 4}, {2, 2})}});
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = folder();
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t config_len = nul ? size_t(nul - data) : size;
  moex::fuzz::write_file(dir + "/config.json", data, config_len);
  const std::string gen = dir + "/generation_config.json";
  if (nul) {
    moex::fuzz::write_file(gen, nul + 1, size - config_len - 1);
  } else {
    std::remove(gen.c_str());
  }
  std::shared_ptr<moex::Checkpoint> ck;
  try {
    ck = moex::Checkpoint::open(dir);
  } catch (const moex::InvalidInput&) {
    return 0;
  }
  if (!ck->config().is_object() || !ck->generation_config().is_object()) std::abort();
  try {
    if (ck->model_type().empty() && !ck->config().at("model_type").is_string()) std::abort();
  } catch (const moex::InvalidInput&) {
  }
  if (ck->names() != std::vector<std::string>{"w"}) std::abort();
  return 0;
}
