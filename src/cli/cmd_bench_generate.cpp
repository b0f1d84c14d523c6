// `moex bench generate`: end-to-end generation speed of a checkpoint, per batch size and prompt
// length, with the floor of every row.
//
// The model is loaded once. Every row (batch B, prompt P) runs one untimed generate of the same
// shape first (plans, workspaces, the caching allocator and the experts' preparation warm up; on
// CUDA it also captures the decode graph, which the timed calls replay: `graph_reused` in the
// JSON), then `--repeats` timed ones; the median row is reported. Prompts are random ids (seeded), and
// stop tokens are ignored so that every row decodes exactly --new-tokens tokens.
//
// Floors (what the row would take if it only moved its bytes at the measured bandwidth, or only
// did its flops at the measured peak; moex/bench.hpp measures both on the device):
// - decode step: the dense weights (all but the experts and the embedding table) + the experts
//   a step hits, E (1 - (1 - k/E)^B) per MoE layer under uniform routing, + the KV cache read
//   (B sequences x the mean cached length x kv bytes per token), over the bandwidth;
// - prefill: 2 x (dense + k/E of the experts' parameters) flops per token (the lm_head once per
//   sequence: only the last row's logits are computed) + attention
//   (B x P (P + 1) / 2 pairs x the model's flops per pair), over the peak.
// The fraction of the floor is floor time / measured time. --bandwidth-gbs / --peak-tflops give
// the ceilings instead (tests use them to keep the 1 GiB bandwidth pass out).
//
// Memory: on CUDA the caching allocator's peak; on the host the process's peak resident set
// (VmHWM), plus the resident set right after the load (VmRSS), so that what generation adds
// (packed experts, the KV cache, activations) reads apart from the mapped checkpoint. VmHWM
// never goes down, so a row's peak includes the rows before it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "cli/load_progress.hpp"
#include "cli/seed.hpp"
#include "moex/bench.hpp"
#include "moex/env_switches.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#if MOEX_WITH_CUDA
#include "ops/cuda/attention_cudnn.hpp"
#endif

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

// A "<key>:   N kB" line of /proc/self/status in bytes (VmRSS, VmHWM); nullopt where the file or
// the line is missing (not Linux), so that the JSON says null rather than a wrong 0.
std::optional<int64_t> proc_status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream in(line.substr(key.size() + 1));
    int64_t kb = 0;
    if (in >> kb) return kb * 1024;
  }
  return std::nullopt;
}

nlohmann::json json_or_null(const std::optional<int64_t>& v) { return v ? nlohmann::json(*v) : nlohmann::json(); }

// The weights' elements for the prefill's flops, from the weight groups' element counts
// (WeightGroupInfo::elements: each weight's values once, whatever they are stored as, so a
// checkpoint kept quantized counts what its dequantized load does): the routed experts', and
// the rest's (the lm_head included, the embedding table not when it is a table of its own).
struct WeightElements {
  double dense = 0, experts = 0;
};
WeightElements weight_elements(const ModelInfo& info) {
  WeightElements w;
  for (const WeightGroupInfo& g : info.weight_groups) {
    if (g.group == "embeddings" && info.embedding_bytes > 0) continue;
    (g.group == "routed_experts" ? w.experts : w.dense) += double(g.elements);
  }
  return w;
}

}  // namespace

int run_bench_generate(const std::vector<std::string>& argv) {
  static const Usage kUsage = [] {
    Usage u{"bench generate", "--model DIR [flags]",
            "End-to-end generation speed per batch size and prompt length (random prompts, stop\n"
            "tokens ignored), with the floor of every row from the measured bandwidth and peak.",
            load_flags()};
    for (auto& f : decode_flags()) u.flags.push_back(f);
    for (auto& f : ep_flags()) u.flags.push_back(f);
    u.flags.insert(u.flags.end(),
                   {{"batch", "B,B", "batch sizes (default 1)"},
                    {"prompt-tokens", "P,P", "prompt lengths (default 128); rows are every (batch, prompt)"},
                    {"cases", "BxP,BxP", "explicit rows instead, e.g. 1x128,32x128,1x4096"},
                    {"new-tokens", "N", "tokens generated per sequence (default 128, >= 2)"},
                    {"repeats", "N", "timed runs per row; the median is reported (default 3)"},
                    {"seed", "N", "seed of the random prompts (default 0)"},
                    {"bandwidth-gbs", "X", "use this bandwidth (GB/s) instead of measuring it"},
                    {"peak-tflops", "Y", "use this peak (TFLOP/s) instead of measuring it"},
                    {"json", "", "one JSON object per row instead of the table"}});
    return u;
  }();
  Args a(argv, kUsage);
  const std::string dir = a.require("model");
  const LoadOptions base = load_options(a);
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
  // The given ceilings (used after the rows): checked before anything runs.
  const double given_bw = a.get_positive_double("bandwidth-gbs", 0), given_peak = a.get_positive_double("peak-tflops", 0);
  if (a.has("cases") && (a.has("batch") || a.has("prompt-tokens")))
    throw InvalidInput("--cases gives the rows itself: drop --batch / --prompt-tokens");
  GenerationOptions g;
  g.max_new_tokens = new_tokens;
  g.eos_token_ids = std::vector<int64_t>{};
  apply_decode_flags(a, g);

  // Every rank (--ep-size, moex launch) runs the same rows; the lead alone measures the ceilings
  // and prints.
  run_ep_ranks(a, base, [&](LoadOptions& o, bool lead) {
    FILE* progress = lead ? stderr : nullptr;
    auto note = [&](const char* fmt, auto... v) {
      if (progress) std::fprintf(progress, fmt, v...);
    };
    note("moex bench generate: loading %s\n", dir.c_str());
    auto lm = from_pretrained(dir, o);
    note_unused_tensors(lm->info(), progress);
    const ModelInfo& info = lm->info();
    const bool host = !info.device.is_cuda();
    const std::optional<int64_t> rss_after_load = host ? proc_status_bytes("VmRSS") : std::nullopt;
    note("moex bench generate: loaded %.2f GB in %.1f s", double(info.weight_bytes) / 1e9, info.load_seconds);
    if (rss_after_load) note(", resident %.2f GB", double(*rss_after_load) / 1e9);
    note("\n");

    const double dense_bytes = double(info.weight_bytes - info.experts_weight_bytes - info.embedding_bytes);
    const double E = double(std::max<int64_t>(info.num_experts, 1)), k = double(info.experts_per_token);
    const double moe_share = info.num_experts > 0 ? k / E : 0.0;
    std::mt19937_64 rng(parse_seed(a.get("seed"), 0));
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
      double prepare_s;  // the warm-up's: the first row packs the experts, later rows find them packed
      bool graph;
      bool graph_reused;  // the timed calls replayed the warm-up's decode graph (no capture)
      std::string graph_note;
      ExpertsImplementation decode_impl;  // what the decode steps ran (GenerationStats)
      std::string decode_switch_note;
    };
    std::vector<Timed> timed;
#if MOEX_WITH_CUDA
    // Steady state: each row's warm-up builds its cuDNN attention graphs (a generate builds them on a
    // thread beside its first prompt of a shape, which runs the project's flash kernel meanwhile).
    ops::cuda::cudnn_attention_synchronous_builds(true);
#endif
    for (const auto& [B, P] : cases) {
      {
        std::vector<int64_t> ids(size_t(B * P));
        for (auto& v : ids) v = id(rng);
        const Tensor input = Tensor::from_ints(ids, {B, P});
        note("moex bench generate: batch %lld, prompt %lld: warm-up\n", (long long)B, (long long)P);
        // The timed runs' options: the same cache capacity, so that every plan keyed by shape (cuDNN's
        // attention graphs of batched prompts) is made here.
        lm->generate(input, g);
        const double prepare_s = lm->last_generation_stats().prepare_seconds;
        note("moex bench generate: batch %lld, prompt %lld: warm-up done (experts prepared in %.2f s)\n",
             (long long)B, (long long)P, prepare_s);
        std::vector<double> prefill, decode;
        for (int64_t r = 0; r < repeats; ++r) {
          lm->generate(input, g);
          const GenerationStats& s = lm->last_generation_stats();
          prefill.push_back(s.prefill_seconds);
          decode.push_back(s.decode_seconds);
          note("moex bench generate: batch %lld, prompt %lld: run %lld of %lld: prefill %.1f tok/s, "
               "decode %.2f tok/s\n",
               (long long)B, (long long)P, (long long)r + 1, (long long)repeats,
               s.prefill_seconds > 0 ? double(B * P) / s.prefill_seconds : 0.0,
               s.decode_seconds > 0 ? double(B * (new_tokens - 1)) / s.decode_seconds : 0.0);
        }
        const GenerationStats& last = lm->last_generation_stats();
        const int64_t peak = host ? proc_status_bytes("VmHWM").value_or(peak_memory_bytes(info.device))
                                  : peak_memory_bytes(info.device);
        timed.push_back({B, P, median(prefill), median(decode), peak, prepare_s, last.graph, last.graph_reused,
                         last.graph_note, last.decode_experts_implementation, last.decode_switch_note});
      }
    }
    if (!lead) return;
    // The ceilings last, so that their buffers do not count in the rows' peak memory.
    CeilingsOptions copt;
    copt.bandwidth = given_bw <= 0;
    copt.peak = given_peak <= 0;
    if (copt.bandwidth || copt.peak)
      note("moex bench generate: measuring the ceilings of %s\n", info.device.str().c_str());
    Ceilings ceil = measure_ceilings(info.device, info.dtype, copt);
    // A given bandwidth stands for whichever one the device's floor divides by.
    if (!copt.bandwidth) {
      ceil.read_gbps = host ? given_bw : 0;
      ceil.copy_gbps = host ? 0 : given_bw;
    }
    if (!copt.peak) ceil.peak_tflops = given_peak;
    if (!json) {
      std::printf("# %s %s on %s: weights %.2f GB, loaded in %.1f s", info.model_type.c_str(),
                  std::string(dtype_name(info.dtype)).c_str(), info.device.str().c_str(),
                  double(info.weight_bytes) / 1e9, info.load_seconds);
      if (rss_after_load) std::printf(", resident after load %.2f GB", double(*rss_after_load) / 1e9);
      std::printf("; ceilings%s: %.1f GB/s, %.2f TFLOP/s [%s]\n", copt.bandwidth && copt.peak ? "" : " (given)",
                  ceil.bandwidth_gbps(), ceil.peak_tflops, ceil.unit.c_str());
      // The experts backends the prefills and the decode steps ran (the decode-stage switch).
      std::printf("# experts: prefill %s, decode %s", experts_implementation_json(lm->get_experts_implementation()).c_str(),
                  timed.empty() ? "-" : experts_implementation_json(timed.front().decode_impl).c_str());
      if (!timed.empty() && !timed.front().decode_switch_note.empty())
        std::printf(" (%s)", timed.front().decode_switch_note.c_str());
      std::printf("\n");
      if (const std::string s = measuring_switches_set(); !s.empty())
        std::printf("# measuring switches set: %s\n", s.c_str());
    }
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
        // The prefill runs the lm_head on each sequence's last row only (generate's last_only).
        const double lm_head_params = double(info.vocab_size) * double(info.hidden_size);
        const WeightElements we = weight_elements(info);
        const double params_per_token = we.dense + we.experts * moe_share - lm_head_params;
        const double prefill_flops = 2.0 * params_per_token * double(B * P) + 2.0 * lm_head_params * double(B) +
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
        // Host only (null on CUDA): the peak resident set and the resident set after the load.
        j["peak_rss_bytes"] = host ? nlohmann::json(t.peak_bytes) : nlohmann::json();
        j["rss_after_load_bytes"] = json_or_null(rss_after_load);
        j["weight_bytes"] = info.weight_bytes;
        j["load_seconds"] = info.load_seconds;
        j["prepare_seconds"] = t.prepare_s;
        j["ceilings_given"] = !copt.bandwidth || !copt.peak;
        j["kernel_unit"] = ceil.unit;
        j["bandwidth_gbps"] = ceil.bandwidth_gbps();
        j["peak_tflops"] = ceil.peak_tflops;
        j["device"] = info.device.str();
        j["dtype"] = std::string(dtype_name(info.dtype));
        j["experts_implementation"] = lm->get_experts_implementation();
        j["decode_experts_implementation"] = t.decode_impl;
        if (!t.decode_switch_note.empty()) j["decode_switch_note"] = t.decode_switch_note;
        j["ep_size"] = o.ep_comm ? o.ep_comm->size() : 1;
        j["tp_size"] = o.tp_comm ? o.tp_comm->size() : 1;
        j["repeats"] = repeats;
        j["graph"] = t.graph;
        j["graph_reused"] = t.graph_reused;
        if (!t.graph_note.empty()) j["graph_note"] = t.graph_note;
        j["measuring_switches"] = measuring_switches_set();
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
  });
  return 0;
}

}  // namespace moex::cli
