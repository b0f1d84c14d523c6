// The experts backend registry. Built-in backends come from one table (builtin_backends.cpp),
// loaded on first use; user code adds or replaces entries with register_experts_backend.
#include <algorithm>
#include <map>
#include <mutex>

#include "core/builtin_backends.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"

namespace moex {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const ExpertsBackend>, std::less<>> backends;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: backends may be used during static teardown
    for (auto& [name, backend] : detail::builtin_experts_backends()) reg->backends[name] = backend;
    return reg;
  }();
  return *r;
}

}  // namespace

void register_experts_backend(const std::string& name, std::shared_ptr<const ExpertsBackend> b) {
  if (name.empty()) throw InvalidInput("an experts backend needs a non-empty name");
  if (!b) throw InvalidInput("register_experts_backend('" + name + "'): null backend");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.backends[name] = std::move(b);
}

std::shared_ptr<const ExpertsBackend> get_experts_backend(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.backends.find(name);
  if (it != r.backends.end()) return it->second;
  std::string list;
  for (auto& [n, b] : r.backends) list += (list.empty() ? "" : ", ") + n;
  throw UnknownName("unknown experts backend '" + std::string(name) + "'; registered: " + list);
}

bool has_experts_backend(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.backends.find(name) != r.backends.end();
}

std::vector<std::string> experts_backend_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> v;
  for (auto& [n, b] : r.backends) v.push_back(n);
  return v;
}

}  // namespace moex
