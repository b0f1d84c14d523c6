// A Hugging Face checkpoint folder: config.json (+ generation_config.json) and either
// model.safetensors or a sharded model.safetensors.index.json. Tensors are memory-mapped and
// looked up by name across shards; nothing is read until asked for.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "moex/safetensors.hpp"
#include "moex/tensor.hpp"

namespace moex {

class Checkpoint {
 public:
  // Throws InvalidInput / Error naming the folder and the file at fault (missing config.json,
  // invalid JSON, index naming a missing shard, a tensor in two shards, ...).
  static std::shared_ptr<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const;             // config.json
  const nlohmann::json& generation_config() const;  // {} when absent
  std::string model_type() const;                   // config["model_type"]

  bool has(const std::string& name) const;
  // The file holding `name`: "DIR/<shard>.safetensors" (for messages). Throws as get().
  std::string file_of(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // The raw tensor as stored (aliasing the mapping). Throws InvalidInput "missing tensor 'x' in DIR".
  Tensor get(const std::string& name) const;
  // The shape the header records (nothing read, nothing allocated). Throws as get().
  Shape shape(const std::string& name) const;
  // get() + checks the shape, then converts to `dtype` if it differs (a copy only then).
  // Throws InvalidInput "tensor 'x' has shape [a, b], expected [c, d]".
  Tensor get(const std::string& name, const Shape& expected, DType dtype) const;

  // Called with the stored bytes of each tensor the checked get() hands out, i.e. as a model is
  // loaded (load progress). Set it before loading; get() calls it on the caller's thread.
  void set_read_hook(std::function<void(int64_t bytes)> hook) { read_hook_ = std::move(hook); }
  // The tensors no checked get() has handed out so far, sorted: after a model's load, the ones it
  // did not use (what transformers warns of as "weights of the checkpoint not used"). Names
  // under a prefix given to leave_unread() are not listed.
  std::vector<std::string> unread() const;
  // Tensors under `prefix` are left unread on purpose (a part of the model moex does not run,
  // such as qwen3_vl_moe's vision tower).
  void leave_unread(const std::string& prefix) const;

 private:
  std::function<void(int64_t bytes)> read_hook_;
  mutable std::mutex read_mu_;
  mutable std::set<std::string> read_;  // names the checked get() handed out
  mutable std::vector<std::string> left_unread_;  // prefixes
  std::string dir_;
  std::shared_ptr<nlohmann::json> config_, generation_config_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;  // shard file -> mapping
  std::map<std::string, std::string> where_;                         // tensor -> shard file
};

}  // namespace moex
