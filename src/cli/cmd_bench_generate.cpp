// `moex bench generate`: end-to-end generation speed of a checkpoint, per batch size and prompt
// length, with the floor of every row.
//
// The model is loaded once. Every row (batch B, prompt P) runs one untimed generate of the same
// shape first (plans, workspaces, the caching allocator and the experts' preparation warm up),
// then `--repeats` timed ones; the median row is reported. Prompts are random ids (seeded), and
// stop tokens are ignored so that every row decodes exactly --new-tokens tokens.
//
// Floors (what the row would take if it only moved its bytes at the measured bandwidth, or only
// did its flops at the measured peak; moex/bench.hpp measures both on the device):
// - decode step: the dense weights (all but the experts and the embedding table) + the experts
//   a step hits, E (1 - (1 - k/E)^B) per MoE layer under uniform routing, + the KV cache read
//   (B sequences x the mean cached length x kv bytes per token), over the bandwidth;
// - prefill: 2 x (dense + k/E of the experts' parameters) flops per token + attention
//   (B x P (P + 1) / 2 pairs x the model's flops per pair), over the peak.
// The fraction of the floor is floor time / measured time.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "moex/bench.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"

namespace moex::cli {

namespace {

struct Row {
  int64_t batch = 0, prompt = 0, new_tokens = 0;
  GenerationStats stats;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int run_bench_generate(const std::vector<std::string>& argv) {
  Args a(argv,
         {"model", "device", "dtype", "batch", "prompt-tokens", "cases", "new-tokens", "experts-implementation",
          "decode-switch", "graph", "repeats", "seed"},
         {"json"});
  const std::string dir = a.require("model");
  LoadOptions o = make_load_options(a.get_or("dtype", ""), a.get_or("device", ""),
                                    a.get_or("experts-implementation", ""));
  const std::vector<int64_t> batches = a.get_int_list("batch", {1});
  const std::vector<int64_t> prompts = a.get_int_list("prompt-tokens", {128});
  const int64_t new_tokens = a.get_int("new-tokens", 128);
  const int64_t repeats = a.get_int("repeats", 3);
  const bool json = a.has("json");
  if (new_tokens < 2) throw InvalidInput("--new-tokens must be >= 2 (a decode step needs a token to feed)");
  if (repeats < 1) throw InvalidInput("--repeats must be >= 1");
  for (int64_t v : batches)
    if (v < 1) throw InvalidInput("--batch entries must be >= 1");
  for (int64_t v : prompts)
    if (v < 1) throw InvalidInput("--prompt-tokens entries must be >= 1");
  GenerationOptions g;
  g.max_new_tokens = new_tokens;
  g.eos_token_ids = std::vector<int64_t>{};
  apply_decode_flags(a, g);

  std::fprintf(stderr, "moex bench generate: loading %s\n", dir.c_str());
  auto lm = from_pretrained(dir, o);
  const ModelInfo& info = lm->info();
  std::fprintf(stderr, "moex bench generate: loaded %.2f GB in %.1f s\n", double(info.weight_bytes) / 1e9,
               info.load_seconds);

  const double es = double(dtype_size(info.dtype));
  const double dense_bytes = double(info.weight_bytes - info.experts_weight_bytes - info.embedding_bytes);
  const double E = double(std::max<int64_t>(info.num_experts, 1)), k = double(info.experts_per_token);
  const double moe_share = info.num_experts > 0 ? k / E : 0.0;
  std::mt19937_64 rng(uint64_t(a.get_int("seed", 0)));
  std::uniform_int_distribution<int64_t> id(0, info.vocab_size - 1);

  // The rows: every (batch, prompt) pair, or the --cases list "BxP,BxP" (e.g. "1x128,32x128,1x4096").
  std::vector<std::pair<int64_t, int64_t>> cases;
  if (auto c = a.get("cases")) {
    for (const std::string& item : a.get_list("cases", {})) {
      const size_t x = item.find('x');
      if (x == std::string::npos) throw InvalidInput("--cases entries are BATCHxPROMPT, got '" + item + "'");
      const int64_t B = parse_int(item.substr(0, x), "--cases batch"), P = parse_int(item.substr(x + 1), "--cases prompt");
      if (B < 1 || P < 1) throw InvalidInput("--cases entries need batch and prompt >= 1, got '" + item + "'");
      cases.emplace_back(B, P);
    }
  } else {
    for (int64_t P : prompts)
      for (int64_t B : batches) cases.emplace_back(B, P);
  }
  struct Timed {
    int64_t B, P;
    double prefill_s, decode_s;
    int64_t peak_bytes;
    bool graph;
    std::string graph_note;
  };
  std::vector<Timed> timed;
  for (const auto& [B, P] : cases) {
    {
      std::vector<int64_t> ids(size_t(B * P));
      for (auto& v : ids) v = id(rng);
      const Tensor input = Tensor::from_ints(ids, {B, P});
      std::fprintf(stderr, "moex bench generate: batch %lld, prompt %lld: warm-up\n", (long long)B, (long long)P);
      GenerationOptions warm = g;
      warm.max_new_tokens = 3;
      lm->generate(input, warm);
      std::vector<double> prefill, decode;
      for (int64_t r = 0; r < repeats; ++r) {
        std::fprintf(stderr, "moex bench generate: batch %lld, prompt %lld: run %lld of %lld\n", (long long)B,
                     (long long)P, (long long)r + 1, (long long)repeats);
        lm->generate(input, g);
        const GenerationStats& s = lm->last_generation_stats();
        prefill.push_back(s.prefill_seconds);
        decode.push_back(s.decode_seconds);
      }
      const GenerationStats& last = lm->last_generation_stats();
      timed.push_back({B, P, median(prefill), median(decode), peak_memory_bytes(info.device), last.graph, last.graph_note});
    }
  }
  // The ceilings last, so that their buffers do not count in the rows' peak memory.
  std::fprintf(stderr, "moex bench generate: measuring the ceilings of %s\n", info.device.str().c_str());
  const Ceilings ceil = measure_ceilings(info.device, info.dtype);
  if (!json)
    std::printf("| batch | prompt | prefill tok/s | decode tok/s | ms/token | TTFT ms | decode floor ms | "
                "of floor | prefill floor ms | of floor | peak memory GB |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Timed& t : timed) {
    {
      const int64_t B = t.B, P = t.P;
      const double tp = t.prefill_s, td = t.decode_s;
      const int64_t steps = new_tokens - 1;  // the prefill chose the first new token
      const double step_s = td / double(steps);
      // Floors.
      const double hit = info.num_experts > 0 ? 1.0 - std::pow(1.0 - k / E, double(B)) : 0.0;
      const double mean_cached = double(P) + double(steps) / 2.0;
      const double step_bytes = dense_bytes + double(info.experts_weight_bytes) * hit +
                                double(B) * mean_cached * double(info.kv_bytes_per_token);
      const double decode_floor_s = ceil.bandwidth_gbps() > 0 ? step_bytes / (ceil.bandwidth_gbps() * 1e9) : 0;
      const double params_per_token = (dense_bytes + double(info.experts_weight_bytes) * moe_share) / es;
      const double prefill_flops = 2.0 * params_per_token * double(B * P) +
                                   double(B) * double(P) * double(P + 1) / 2.0 * double(info.attention_flops_per_pair);
      const double prefill_floor_s = ceil.peak_tflops > 0 ? prefill_flops / (ceil.peak_tflops * 1e12) : 0;
      nlohmann::json j;
      j["batch"] = B;
      j["prompt_tokens"] = P;
      j["new_tokens"] = new_tokens;
      j["prefill_tokens_per_second"] = tp > 0 ? double(B * P) / tp : 0;
      j["decode_tokens_per_second"] = td > 0 ? double(B * steps) / td : 0;
      j["ms_per_token"] = step_s * 1e3;
      j["time_to_first_token_ms"] = tp * 1e3;
      j["decode_step_bytes"] = step_bytes;
      j["decode_floor_ms"] = decode_floor_s * 1e3;
      j["decode_fraction_of_floor"] = step_s > 0 ? decode_floor_s / step_s : 0;
      j["prefill_flops"] = prefill_flops;
      j["prefill_floor_ms"] = prefill_floor_s * 1e3;
      j["prefill_fraction_of_floor"] = tp > 0 ? prefill_floor_s / tp : 0;
      j["peak_memory_bytes"] = t.peak_bytes;
      j["bandwidth_gbps"] = ceil.bandwidth_gbps();
      j["peak_tflops"] = ceil.peak_tflops;
      j["device"] = info.device.str();
      j["dtype"] = std::string(dtype_name(info.dtype));
      j["experts_implementation"] = lm->get_experts_implementation();
      j["repeats"] = repeats;
      j["graph"] = t.graph;
      if (!t.graph_note.empty()) j["graph_note"] = t.graph_note;
      if (json) {
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("| %lld | %lld | %.0f | %.1f | %.2f | %.1f | %.3f | %.0f%% | %.2f | %.0f%% | %.2f |\n",
                    (long long)B, (long long)P, j["prefill_tokens_per_second"].get<double>(),
                    j["decode_tokens_per_second"].get<double>(), step_s * 1e3, tp * 1e3, decode_floor_s * 1e3,
                    100 * j["decode_fraction_of_floor"].get<double>(), prefill_floor_s * 1e3,
                    100 * j["prefill_fraction_of_floor"].get<double>(),
                    double(j["peak_memory_bytes"].get<int64_t>()) / 1e9);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace moex::cli
