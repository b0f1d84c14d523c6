// libFuzzer target for sharded checkpoints: model.safetensors.index.json as Checkpoint::open
// reads it. The input is the index file, written into a scratch folder that holds config.json and
// two valid shards (tensors a, b in the first, c in the second) and no model.safetensors.
//
// Opening must succeed or throw moex::InvalidInput (a shard name outside the folder, a missing
// shard, a tensor in two shards, a weight_map entry its shard does not hold, ...). An opened
// checkpoint must list exactly the tensors of the shards its weight_map names, each readable with
// the shape it was saved with. Anything else aborts or escapes, and libFuzzer reports it.
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "fuzz_folder.hpp"
#include "moex/checkpoint.hpp"
#include "moex/error.hpp"
#include "moex/safetensors.hpp"

namespace {

const std::map<std::string, moex::Shape> kShapes = {{"a", {2, 2}}, {"b", {3}}, {"c", {1, 2}}};

const std::string& folder() {
  static const std::string dir = [] {
    const std::string d = moex::fuzz::scratch_dir();
    moex::fuzz::write_file(d + "/config.json", R"({"model_type":"toy"})");
    moex::save_safetensors(d + "/model-00001-of-00002.safetensors",
                           {{"a", moex::Tensor::from_floats({1, 2, 3, 4}, {2, 2})},
                            {"b", moex::Tensor::from_ints({5, 6, 7}, {3})}});
    moex::save_safetensors(d + "/model-00002-of-00002.safetensors",
                           {{"c", moex::Tensor::from_floats({8, 9}, {1, 2}, moex::DType::kBF16)}});
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = folder();
  moex::fuzz::write_file(dir + "/model.safetensors.index.json", data, size);
  std::shared_ptr<moex::Checkpoint> ck;
  try {
    ck = moex::Checkpoint::open(dir);
  } catch (const moex::InvalidInput&) {
    return 0;
  }
  // Shards come whole: a and b together or neither; c alone.
  const auto names = ck->names();
  if (names.empty()) {
    // Only an empty weight_map opens no shard.
    return 0;
  }
  for (const auto& name : names) {
    const auto it = kShapes.find(name);
    if (it == kShapes.end() || !ck->has(name)) std::abort();
    if (ck->get(name).shape() != it->second) std::abort();
  }
  if (ck->has("a") != ck->has("b")) std::abort();
  try {
    (void)ck->get("not_there");
    std::abort();
  } catch (const moex::InvalidInput&) {
  }
  return 0;
}
