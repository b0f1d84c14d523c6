// The experts backend registry. Backends register themselves (MOEX_REGISTER_EXPERTS_BACKEND in
// their own file, or register_experts_backend from user code), one implementation per device
// under a name; the core knows no backend.
#include <algorithm>
#include <map>
#include <mutex>

#include "moex/error.hpp"
#include "moex/experts.hpp"

namespace moex {
namespace {

bool serves(const ExpertsBackend& b, DeviceKind d) {
  const auto devs = b.caps().devices;
  return std::find(devs.begin(), devs.end(), d) != devs.end();
}

// One name, several per-device implementations: each call goes to the implementation for the
// device of its tensors (prepare: the weights' device; forward: the inputs', validated equal).
class DeviceDispatch final : public ExpertsBackend {
 public:
  explicit DeviceDispatch(std::vector<std::shared_ptr<const ExpertsBackend>> impls)
      : impls_(std::move(impls)) {}

  BackendCaps caps() const override {
    BackendCaps c;
    for (auto& i : impls_) {
      BackendCaps ic = i->caps();
      for (auto d : ic.devices)
        if (std::find(c.devices.begin(), c.devices.end(), d) == c.devices.end()) c.devices.push_back(d);
      for (auto t : ic.dtypes)
        if (std::find(c.dtypes.begin(), c.dtypes.end(), t) == c.dtypes.end()) c.dtypes.push_back(t);
      c.quantized_weights |= ic.quantized_weights;
      // Only when every device's implementation does (Experts asks the implementation for the
      // weights' device itself).
      c.reads_per_expert = (&i == &impls_.front() || c.reads_per_expert) && ic.reads_per_expert;
      // Capturable where some device's implementation is (host code has no graph to be in).
      c.graph_capturable |= ic.graph_capturable;
      if (c.description.empty()) c.description = ic.description;
    }
    return c;
  }
  std::string unsupported_reason(const ExpertsSpec& spec, DType dtype, Device device) const override {
    const ExpertsBackend* i = impl_for(device);
    return i ? i->unsupported_reason(spec, dtype, device)
             : ExpertsBackend::unsupported_reason(spec, dtype, device);
  }
  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& spec,
                                           const ExpertsWeights& weights) const override {
    return impl(weights.device()).prepare(spec, weights);
  }
  void forward(const ExpertsProblem& p, Tensor& out, const ExecContext& ctx) const override {
    impl(p.hidden.device()).forward(p, out, ctx);
  }

 private:
  const ExpertsBackend* impl_for(Device d) const {
    for (auto& i : impls_)
      if (serves(*i, d.kind)) return i.get();
    return nullptr;
  }
  const ExpertsBackend& impl(Device d) const {
    if (const ExpertsBackend* i = impl_for(d)) return *i;
    throw Unsupported("no implementation for device " + d.str());
  }
  std::vector<std::shared_ptr<const ExpertsBackend>> impls_;
};

struct Entry {
  std::vector<std::shared_ptr<const ExpertsBackend>> impls;
  std::shared_ptr<const ExpertsBackend> front;  // impls[0] alone, or a DeviceDispatch over them
};

struct Registry {
  std::mutex mu;
  std::map<std::string, Entry, std::less<>> backends;
};

Registry& registry() {
  // Never destroyed: backends may be used during static teardown, and registrations run during
  // static initialisation of the library and of plugins, in any order.
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

void register_experts_backend(const std::string& name, std::shared_ptr<const ExpertsBackend> b) {
  if (name.empty()) throw InvalidInput("an experts backend needs a non-empty name");
  if (!b) throw InvalidInput("register_experts_backend('" + name + "'): null backend");
  const BackendCaps caps = b->caps();
  if (caps.devices.empty())
    throw InvalidInput("register_experts_backend('" + name + "'): caps() lists no device");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Entry& e = r.backends[name];
  // The new implementation takes over every device it lists; earlier ones keep the rest.
  std::vector<std::shared_ptr<const ExpertsBackend>> kept;
  for (auto& old : e.impls) {
    bool overlaps = false;
    for (auto d : caps.devices) overlaps |= serves(*old, d);
    if (!overlaps) kept.push_back(old);
  }
  kept.push_back(std::move(b));
  e.impls = std::move(kept);
  e.front = e.impls.size() == 1 ? e.impls[0] : std::make_shared<DeviceDispatch>(e.impls);
}

std::shared_ptr<const ExpertsBackend> get_experts_backend(std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.backends.find(name);
  if (it != r.backends.end()) return it->second.front;
  std::string list;
  for (auto& [n, b] : r.backends) list += (list.empty() ? "" : ", ") + n;
  throw UnknownName("unknown experts backend '" + std::string(name) + "'; registered: " + list);
}

std::vector<std::shared_ptr<const ExpertsBackend>> experts_backend_implementations(
    std::string_view name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.backends.find(name);
  return it == r.backends.end() ? std::vector<std::shared_ptr<const ExpertsBackend>>{}
                                : it->second.impls;
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
