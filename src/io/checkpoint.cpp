// Hugging Face checkpoint folders.
//
// Opening maps every weights file and validates every header up front (cheap: headers only, the
// data pages stay on disk), so a broken sharded index is reported when the folder is opened, not
// halfway through building a model. Names follow transformers: model.safetensors wins over a
// sharded index when both exist, as in from_pretrained.
#include "moex/checkpoint.hpp"

#include <filesystem>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "io/strict_json.hpp"
#include "moex/error.hpp"

namespace moex {
namespace {

namespace fs = std::filesystem;

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// A shard name from an index must stay inside the checkpoint folder.
bool safe_shard_name(const std::string& s) {
  // A NUL would end the name where the file system reads it: "a\0b" would open "a".
  if (s.empty() || s.find('\0') != std::string::npos) return false;
  const fs::path p(s);
  if (p.is_absolute()) return false;
  for (const auto& part : p)
    if (part == "..") return false;
  return true;
}

std::string dtype_str(DType t) { return std::string(dtype_name(t)); }

}  // namespace

std::shared_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InvalidInput("checkpoint folder '" + dir + "' does not exist or is not a folder");
  auto ck = std::make_shared<Checkpoint>();
  ck->dir_ = dir;
  const fs::path root(dir);

  const fs::path config_path = root / "config.json";
  if (!is_file(config_path)) throw InvalidInput(dir + ": missing config.json");
  ck->config_ = std::make_shared<nlohmann::json>(io::read_json_file(config_path.string()));
  if (!ck->config_->is_object())
    throw InvalidInput(config_path.string() + ": must be a JSON object, got " +
                       io::json_type_name(*ck->config_));

  const fs::path gen_path = root / "generation_config.json";
  ck->generation_config_ = std::make_shared<nlohmann::json>(nlohmann::json::object());
  if (is_file(gen_path)) {
    *ck->generation_config_ = io::read_json_file(gen_path.string());
    if (!ck->generation_config_->is_object())
      throw InvalidInput(gen_path.string() + ": must be a JSON object, got " +
                         io::json_type_name(*ck->generation_config_));
  }

  const fs::path single = root / "model.safetensors";
  const fs::path index_path = root / "model.safetensors.index.json";
  if (is_file(single)) {
    auto file = SafetensorsFile::open(single.string());
    for (const auto& [name, e] : file->entries()) ck->where_[name] = "model.safetensors";
    ck->files_["model.safetensors"] = std::move(file);
    return ck;
  }
  if (!is_file(index_path))
    throw InvalidInput(dir + ": no model.safetensors or model.safetensors.index.json");

  const std::string ip = index_path.string();
  // Duplicate keys are rejected by the strict parser: "tensor listed twice" in the weight_map.
  const nlohmann::json index = io::read_json_file(ip);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw InvalidInput(ip + ": expected an object with a 'weight_map' object");
  const auto& weight_map = index["weight_map"];
  std::set<std::string> shards;
  for (const auto& [name, shard] : weight_map.items()) {
    if (!shard.is_string())
      throw InvalidInput(ip + ": tensor '" + io::printable(name) + "' maps to " + io::json_type_name(shard) +
                         ", expected a shard file name");
    const std::string s = shard.get<std::string>();
    if (!safe_shard_name(s))
      throw InvalidInput(ip + ": tensor '" + io::printable(name) + "' maps to shard '" + io::printable(s) +
                         "', which is not a file name inside the folder");
    if (!is_file(root / s))
      throw InvalidInput(ip + ": tensor '" + io::printable(name) + "' maps to shard '" + io::printable(s) +
                         "', which does not exist in " + dir);
    shards.insert(s);
  }
  for (const auto& s : shards) {
    auto file = SafetensorsFile::open((root / s).string());
    for (const auto& [name, e] : file->entries()) {
      const auto [it, fresh] = ck->where_.emplace(name, s);
      if (!fresh)
        throw InvalidInput(ip + ": tensor '" + io::printable(name) + "' is stored in both '" + io::printable(it->second) +
                           "' and '" + io::printable(s) + "'");
    }
    ck->files_[s] = std::move(file);
  }
  for (const auto& [name, shard] : weight_map.items()) {
    const auto it = ck->where_.find(name);
    if (it == ck->where_.end() || it->second != shard.get<std::string>())
      throw InvalidInput(ip + ": maps tensor '" + io::printable(name) + "' to '" + io::printable(shard.get<std::string>()) +
                         "', which does not contain it");
  }
  return ck;
}

const nlohmann::json& Checkpoint::config() const { return *config_; }
const nlohmann::json& Checkpoint::generation_config() const { return *generation_config_; }

std::string Checkpoint::model_type() const {
  const auto it = config_->find("model_type");
  if (it == config_->end() || !it->is_string())
    throw InvalidInput(dir_ + "/config.json: no string 'model_type'");
  return it->get<std::string>();
}

bool Checkpoint::has(const std::string& name) const { return where_.count(name) != 0; }

std::string Checkpoint::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw InvalidInput("missing tensor '" + io::printable(name) + "' in " + dir_);
  return dir_ + "/" + it->second;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, shard] : where_) out.push_back(name);
  return out;
}

std::vector<std::string> Checkpoint::unread() const {
  std::lock_guard<std::mutex> g(read_mu_);
  std::vector<std::string> out;
  for (const auto& [name, shard] : where_) {
    if (read_.count(name)) continue;
    bool left = false;
    for (const std::string& p : left_unread_) left |= name.rfind(p, 0) == 0;
    if (!left) out.push_back(name);
  }
  return out;
}

void Checkpoint::leave_unread(const std::string& prefix) const {
  std::lock_guard<std::mutex> g(read_mu_);
  left_unread_.push_back(prefix);
}

Tensor Checkpoint::get(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw InvalidInput("missing tensor '" + io::printable(name) + "' in " + dir_);
  return files_.at(it->second)->get(name);
}

Shape Checkpoint::shape(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) throw InvalidInput("missing tensor '" + io::printable(name) + "' in " + dir_);
  return files_.at(it->second)->entry(name).shape;
}

Tensor Checkpoint::get(const std::string& name, const Shape& expected, DType dtype) const {
  Tensor t = get(name);
  if (t.shape() != expected)
    throw InvalidInput("tensor '" + name + "' in " + dir_ + " has shape " + shape_str(t.shape()) +
                       ", expected " + shape_str(expected));
  if (read_hook_) read_hook_(int64_t(t.nbytes()));
  {
    std::lock_guard<std::mutex> g(read_mu_);
    read_.insert(name);
  }
  if (t.dtype() == dtype) return t;
  // FP4 pairs travel as int8/uint8 bytes: same bytes, same (byte) shape, only the label changes.
  if (dtype == DType::kFP4x2 && (t.dtype() == DType::kI8 || t.dtype() == DType::kU8)) {
    const size_t offset = size_t(static_cast<const char*>(t.raw()) -
                                 static_cast<const char*>(t.storage()->data()));
    return Tensor(t.storage(), offset, DType::kFP4x2, t.shape(), t.strides());
  }
  if (!is_floating(t.dtype()) || !is_floating(dtype) || t.dtype() == DType::kFP4x2)
    throw InvalidInput("tensor '" + name + "' in " + dir_ + " has dtype " + dtype_str(t.dtype()) +
                       ", which cannot be converted to " + dtype_str(dtype));
  return t.to(dtype);
}

}  // namespace moex
