// The "auto" experts backend (moex/experts_auto.hpp): grouped_mm or batched_mm per call, from a
// table of both backends' times at bucket sizes, measured on the device at the first call of an
// experts shape and kept in a cache file. A backend like any other: registered by name, served
// through the same interface, so the per-sub-config map, the decode stage and graphs take it.
#include "moex/experts_auto.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "core/device_hooks.hpp"
#include "core/env_switch_read.hpp"
#include "io/output_file.hpp"
#include "moex/bench.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"

namespace moex {
namespace {

constexpr const char* kGrouped = "grouped_mm";
constexpr const char* kBatched = "batched_mm";
// Calls of up to 8192 tokens are measured; larger ones take the last bucket's choice (grouped_mm
// wins every large call measured, and the gap only grows with tokens).
constexpr int64_t kBuckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};

// Tables of this process, by key; a vector keeps the order first used.
struct Tables {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const ExpertsAutoTable>> by_key;
  std::vector<std::shared_ptr<const ExpertsAutoTable>> order;
};
Tables& tables() {
  static Tables t;
  return t;
}

nlohmann::json to_json(const ExpertsAutoTable& t) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : t.rows)
    rows.push_back({{"tokens", r.tokens}, {"grouped_mm_ms", r.grouped_mm_ms}, {"batched_mm_ms", r.batched_mm_ms},
                    {"choice", r.choice}});
  return rows;
}

// The cached table of `key`, or none (no file, unreadable, or no entry: all mean "measure").
std::optional<ExpertsAutoTable> read_cached(const std::string& file, const std::string& key) {
  if (file.empty()) return std::nullopt;
  std::ifstream in(file);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (!j.is_object() || !j.contains(key)) return std::nullopt;
    ExpertsAutoTable t;
    t.key = key;
    t.source = "cache " + file;
    for (const auto& r : j.at(key)) {
      ExpertsAutoRow row;
      row.tokens = r.at("tokens").get<int64_t>();
      row.grouped_mm_ms = r.at("grouped_mm_ms").get<double>();
      row.batched_mm_ms = r.at("batched_mm_ms").get<double>();
      row.choice = r.at("choice").get<std::string>();
      if (row.choice != kGrouped && row.choice != kBatched) return std::nullopt;
      t.rows.push_back(row);
    }
    if (t.rows.empty()) return std::nullopt;
    return t;
  } catch (const std::exception&) {
    return std::nullopt;  // a damaged cache is measured over, then rewritten
  }
}

// Adds `t` to the cache file (read, merge, write to a temporary file renamed into place). A cache
// that cannot be written costs a measurement next time, nothing else: failures are ignored.
void write_cached(const std::string& file, const ExpertsAutoTable& t) {
  if (file.empty()) return;
  try {
    nlohmann::json j = nlohmann::json::object();
    if (std::ifstream in(file); in) {
      try {
        j = nlohmann::json::parse(in);
      } catch (const std::exception&) {
      }
      if (!j.is_object()) j = nlohmann::json::object();
    }
    j[t.key] = to_json(t);
    std::filesystem::create_directories(std::filesystem::path(file).parent_path());
    const std::string text = j.dump(1) + "\n";
    io::OutputFile out(file);
    out.write(text.data(), text.size());
    out.commit();
  } catch (const std::exception&) {
  }
}

// Random routing of `tokens` tokens to k distinct experts each, equal weights.
void random_routing(int64_t tokens, int64_t k, int64_t experts, Device dev, Tensor& idx, Tensor& w) {
  std::mt19937_64 rng(12345);
  std::vector<int64_t> ids(size_t(tokens * k));
  std::vector<int64_t> pool(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < experts; ++e) pool[size_t(e)] = e;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t pick = j + int64_t(rng() % uint64_t(experts - j));
      std::swap(pool[size_t(j)], pool[size_t(pick)]);
      ids[size_t(t * k + j)] = pool[size_t(j)];
    }
  }
  idx = Tensor::from_ints(ids, {tokens, k}).to(dev);
  w = Tensor::from_floats(std::vector<float>(size_t(tokens * k), 1.0f / float(k)), {tokens, k}).to(dev);
}

struct AutoPrepared final : PreparedExperts {
  std::shared_ptr<const ExpertsBackend> grouped, batched;
  std::unique_ptr<PreparedExperts> grouped_prep, batched_prep;
  std::string device_name;
  // Tables by top-k (the spec does not fix k; routing does), resolved at the first call.
  mutable std::mutex mu;
  mutable std::map<int64_t, std::shared_ptr<const ExpertsAutoTable>> by_k;
};

class AutoBackend final : public ExpertsBackend {
 public:
  BackendCaps caps() const override {
    BackendCaps c;
    c.devices = {DeviceKind::kCPU, DeviceKind::kCUDA};
    c.dtypes = {DType::kBF16, DType::kF16, DType::kF32};
    c.graph_capturable = true;
    c.quantized_weights = true;
    c.description =
        "grouped_mm or batched_mm per call, by the call's token count, from both backends' times measured "
        "on the device at the first call of a shape (cached on disk; grouped_mm on the CPU)";
    return c;
  }

  std::string unsupported_reason(const ExpertsSpec& spec, DType dtype, Device device) const override {
    std::string why = ExpertsBackend::unsupported_reason(spec, dtype, device);
    if (!why.empty()) return why;
    for (const char* name : {kGrouped, kBatched}) {
      if (device.is_cpu() && std::string(name) == kBatched) continue;
      if (!has_experts_backend(name)) return std::string("needs the ") + name + " backend, which is not registered";
      why = get_experts_backend(name)->unsupported_reason(spec, dtype, device);
      if (!why.empty()) return "picks " + std::string(name) + ", which " + why;
    }
    return {};
  }

  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& spec, const ExpertsWeights& weights) const override {
    auto p = std::make_unique<AutoPrepared>();
    const Device dev = weights.device();
    p->grouped = get_experts_backend(kGrouped);
    p->grouped_prep = p->grouped->prepare(spec, weights);
    if (dev.is_cuda()) {
      p->batched = get_experts_backend(kBatched);
      p->batched_prep = p->batched->prepare(spec, weights);
      p->device_name = detail::device_name(dev);
    }
    return p;
  }

  void forward(const ExpertsProblem& pr, Tensor& out, const ExecContext& ctx) const override {
    const auto* p = dynamic_cast<const AutoPrepared*>(pr.prepared);
    if (!p) throw InvalidInput("the auto experts backend runs on the state its prepare() made (none given)");
    const ExpertsAutoTable& t = table(*p, pr);
    ExpertsProblem q = pr;
    if (t.choose(pr.tokens()) == kBatched) {
      q.prepared = p->batched_prep.get();
      p->batched->forward(q, out, ctx);
    } else {
      q.prepared = p->grouped_prep.get();
      p->grouped->forward(q, out, ctx);
    }
  }

 private:
  const ExpertsAutoTable& table(const AutoPrepared& p, const ExpertsProblem& pr) const {
    const int64_t k = pr.top_k();
    std::lock_guard<std::mutex> lock(p.mu);
    if (auto it = p.by_k.find(k); it != p.by_k.end()) return *it->second;
    const Device dev = pr.hidden.device();
    const std::string key = (dev.is_cuda() ? p.device_name : std::string("cpu")) + " | " + pr.spec->str() +
                            " | top-" + std::to_string(k) + " | " + std::string(dtype_name(pr.hidden.dtype()));
    Tables& all = tables();
    std::shared_ptr<const ExpertsAutoTable> t;
    {
      std::lock_guard<std::mutex> g(all.mu);
      if (auto it = all.by_key.find(key); it != all.by_key.end()) t = it->second;
    }
    if (!t) {
      ExpertsAutoTable made;
      if (dev.is_cpu()) {
        made.key = key;
        made.source = "rule";
        made.rows.push_back({kBuckets[0], 0, 0, kGrouped});
      } else if (auto cached = read_cached(experts_auto_cache_file(), key)) {
        made = *cached;
      } else {
        if (detail::capturing(dev))
          throw Unsupported("the auto experts backend measures its table at the first call of a shape, which "
                            "cannot happen inside a CUDA graph capture: run one call directly first");
        made = measure(p, pr, key);
        write_cached(experts_auto_cache_file(), made);
      }
      std::lock_guard<std::mutex> g(all.mu);
      auto [it, fresh] = all.by_key.emplace(key, std::make_shared<const ExpertsAutoTable>(std::move(made)));
      if (fresh) all.order.push_back(it->second);
      t = it->second;
    }
    p.by_k[k] = t;
    return *t;
  }

  // Both backends at every bucket on random routing, the L2 flushed before each timed call.
  static ExpertsAutoTable measure(const AutoPrepared& p, const ExpertsProblem& pr, const std::string& key) {
    const Device dev = pr.hidden.device();
    const int64_t H = pr.spec->hidden, E = pr.spec->num_experts, k = std::min(pr.top_k(), E);
    const int64_t most = kBuckets[std::size(kBuckets) - 1];
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> h(size_t(most * H));
    for (auto& x : h) x = nd(rng);
    const Tensor hidden_all = Tensor::from_floats(h, {most, H}, pr.hidden.dtype()).to(dev);
    Tensor idx_all, w_all;
    random_routing(most, k, E, dev, idx_all, w_all);
    ExpertsAutoTable t;
    t.key = key;
    t.source = "measured";
    int batched_lost = 0;  // buckets in a row where batched_mm took over 2x grouped_mm's time
    for (int64_t T : kBuckets) {
      ExpertsProblem q = pr;
      q.hidden = hidden_all.slice(0, 0, T);
      q.top_k_index = idx_all.slice(0, 0, T);
      q.top_k_weights = w_all.slice(0, 0, T);
      q.weights_per_expert = false;
      Tensor out = Tensor::empty({T, H}, pr.hidden.dtype(), dev);
      const ExecContext ctx = ExecContext::on(dev).resolved();
      auto time_of = [&](const ExpertsBackend& b, const PreparedExperts* prep) {
        q.prepared = prep;
        return time_cuda_ms(dev, [&] { b.forward(q, out, ctx); }, false, 1, 5);
      };
      ExpertsAutoRow row;
      row.tokens = T;
      row.grouped_mm_ms = time_of(*p.grouped, p.grouped_prep.get());
      if (batched_lost < 2) {
        row.batched_mm_ms = time_of(*p.batched, p.batched_prep.get());
        batched_lost = row.batched_mm_ms > 2 * row.grouped_mm_ms ? batched_lost + 1 : 0;
      }
      row.choice = row.batched_mm_ms > 0 && row.batched_mm_ms < row.grouped_mm_ms ? kBatched : kGrouped;
      t.rows.push_back(row);
    }
    return t;
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("auto", AutoBackend);

}  // namespace

const std::string& ExpertsAutoTable::choose(int64_t tokens) const {
  for (const auto& r : rows)
    if (tokens <= r.tokens) return r.choice;
  return rows.back().choice;
}

std::vector<ExpertsAutoTable> experts_auto_tables() {
  Tables& all = tables();
  std::lock_guard<std::mutex> g(all.mu);
  std::vector<ExpertsAutoTable> v;
  for (const auto& t : all.order) v.push_back(*t);
  return v;
}

std::string experts_auto_cache_file() {
  auto env = [](const char* n) -> std::string {
    const char* v = std::getenv(n);
    return v && *v ? std::string(v) : std::string();
  };
  if (auto d = env_switch_text("MOEX_CACHE_DIR")) return *d + "/experts_auto.json";
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/moex/experts_auto.json";
  if (std::string d = env("HOME"); !d.empty()) return d + "/.cache/moex/experts_auto.json";
  return {};
}

}  // namespace moex
