// `moex bench experts`: times each experts backend on synthetic weights over token counts, after
// checking its result, and prints the floor and the fraction of it reached.
//
// Floor = max(bytes / measured bandwidth, flops / measured peak) with bytes = the weights of the
// distinct experts hit + activations in and out, flops = 2 T k (R H + H I). Weights are kept out
// of the caches (CPU: a buffer several times the last-level cache is streamed before every timed
// run; CUDA: the L2 is flushed before every timed run), so the floor is the honest DRAM/HBM one.
// --dtype fp8 / fp4: block-scaled experts weights (moex/quant.hpp; random codes and block scales),
// bfloat16 activations; bytes count the stored weights and their scales, and the peak is the
// float32 FMA one (the unit the CUDA-core quantized kernels compute in), except fp8 on a GPU:
// there grouped_mm runs the e4m3 tensor cores where the plan picks them (Hopper), and the peak is
// twice the measured bf16 tensor-core one (FP8 tensor cores run twice the bf16 rate: H100 / H200
// dense 1979 against 989 TFLOP/s). The reference check then allows the bound of
// experts_reference_f64_bounded for intermediate elements near an e4m3 midpoint.
// Check: eager's rows for a sample of tokens against the float64 reference, every other backend
// against eager on the same tokens (a token's output depends only on its own inputs); where CUDA
// graph replays are timed, the output of a replay is checked too. A row that was not checked
// (--no-check, T = 0) says so: "unchecked" in the table, null in JSON.
// Uses the public API only (moex/...): ceilings and CUDA timing come from moex/bench.hpp.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/command.hpp"
#include "cli/seed.hpp"
#include "moex/bench.hpp"
#include "moex/check.hpp"
#include "moex/cpu_kernels.hpp"
#include "moex/env_switches.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"

namespace moex::cli {
namespace {

struct NamedShape {
  const char* name;
  int64_t E, k, H, I;
};
constexpr NamedShape kShapes[] = {
    {"qwen1.5-moe-a2.7b", 60, 4, 2048, 1408},
    {"deepseek-v3", 256, 8, 7168, 2048},
    {"mixtral-8x7b", 8, 2, 4096, 14336},
};

// Fills n values of `dt` with U(-a, a), in parallel, from a counter-based hash (fast and
// reproducible regardless of the thread count).
void fill_random(void* dst, DType dt, int64_t n, float a, uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = (uint64_t(i) + seed * 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 29;
    float v = (float(z >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f) * a;
    switch (dt) {
      case DType::kF32: static_cast<float*>(dst)[i] = v; break;
      case DType::kBF16: static_cast<uint16_t*>(dst)[i] = float_to_bf16(v); break;
      default: static_cast<uint16_t*>(dst)[i] = float_to_f16(v); break;
    }
  }
}

Tensor random_tensor(Shape shape, DType dt, float a, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dt);
  fill_random(t.raw(), dt, t.numel(), a, seed);
  return t;
}

struct Routing {
  Tensor idx, w;
  int64_t distinct = 0;
};

Routing make_routing(int64_t T, int64_t k, int64_t E, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(T * k)), perm(static_cast<size_t>(E));
  std::vector<float> w(static_cast<size_t>(T * k));
  std::set<int64_t> hit;
  std::uniform_real_distribution<float> u(0.05f, 1.f);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t j = 0; j < k; ++j) {  // partial Fisher-Yates: k distinct experts
      std::swap(perm[size_t(j)], perm[size_t(j + int64_t(rng() % uint64_t(E - j)))]);
      ids[size_t(t * k + j)] = perm[size_t(j)];
      hit.insert(perm[size_t(j)]);
      w[size_t(t * k + j)] = u(rng);
    }
  }
  return {Tensor::from_ints(ids, {T, k}), Tensor::from_floats(w, {T, k}), int64_t(hit.size())};
}

// Rows `rows` of a [T, C] host tensor.
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  Tensor h = t.device().host_accessible() ? t : t.to(Device::cpu());
  Tensor out = Tensor::empty({int64_t(rows.size()), h.size(1)}, h.dtype());
  size_t row_bytes = size_t(h.size(1)) * dtype_size(h.dtype());
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(out.raw()) + i * row_bytes,
                static_cast<const char*>(h.raw()) + size_t(rows[i]) * row_bytes, row_bytes);
  return out;
}

// Reads a buffer several times the last-level cache so that weights are not cache-resident.
// Reads only: the caches are left holding clean lines, as a model step leaves them (it reads
// weights and writes little). A writing sweep left them full of dirty lines whose write-backs
// then shared the DRAM with the timed call's reads (docs/cpu.md, "The cache evictor").
class CacheEvictor {
 public:
  CacheEvictor() {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t bytes = std::max<size_t>(size_t(std::max(l3, 0L)) * 4, size_t(256) << 20);
    buf_.assign(bytes / sizeof(uint64_t), 1);
  }
  void evict() {
    uint64_t s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (size_t i = 0; i < buf_.size(); i += 8) s += buf_[i];
    sink_ = sink_ + s;
  }

 private:
  std::vector<uint64_t> buf_;
  volatile uint64_t sink_ = 0;
};

// --graph: time direct launches, CUDA graph replays, or both.
enum class GraphMode : unsigned char { kOff, kOn, kBoth };
GraphMode parse_graph_mode(const std::string& s) {
  if (s == "off") return GraphMode::kOff;
  if (s == "on") return GraphMode::kOn;
  if (s == "both") return GraphMode::kBoth;
  throw InvalidInput("--graph must be off, on or both, not '" + s + "'");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double time_cpu_ms(const std::function<void()>& fn, CacheEvictor& ev, int min_iters,
                   double budget_s) {
  fn();  // warm-up (prepare, workspaces, page faults)
  std::vector<double> ms;
  auto start = std::chrono::steady_clock::now();
  while (int(ms.size()) < min_iters ||
         (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
              budget_s &&
          ms.size() < 200)) {
    ev.evict();
    auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(ms);
}

int run_bench_experts(const std::vector<std::string>& argv) {
  static const Usage kUsage{
      "bench experts", "[--shape NAME | --experts E --top-k K --hidden H --intermediate I] [flags]",
      "Time each experts backend on synthetic weights over token counts, after checking its result\n"
      "against the float64 reference, with the floor (bytes over bandwidth, flops over peak).",
      {{"device", "DEV", "cpu (default) or cuda[:I]"},
       {"dtype", "D", "bfloat16 (default), float16, float32, or fp8 / fp4 (block-scaled weights, "
                      "bfloat16 activations)"},
       {"scale-fmt", "F", "fp8: float (default) or ue8m0 block scales"},
       {"shape", "NAME", "qwen1.5-moe-a2.7b (default), deepseek-v3 or mixtral-8x7b"},
       {"experts", "E", "custom shape: experts per layer"},
       {"top-k", "K", "custom shape: experts per token"},
       {"hidden", "H", "custom shape: hidden size"},
       {"intermediate", "I", "custom shape: expert intermediate size"},
       {"tokens", "T,T", "token counts (default 1,4,16,64,256,1024,4096)"},
       {"backends", "A,B", "backends to time (default: every one that supports the device and dtype)"},
       {"graph", "MODE", "off|on|both: time direct launches, CUDA graph replays or both (CUDA default both; with both, a backend that cannot be captured gets its direct row only)"},
       {"bandwidth-gbs", "X", "use this bandwidth (GB/s) instead of measuring it"},
       {"peak-tflops", "Y", "use this peak (TFLOP/s) instead of measuring it"},
       {"min-iters", "N", "timed runs at least (default 5)"},
       {"budget-s", "S", "CPU: keep timing up to S seconds per row (default 1)"},
       {"seed", "N", "seed of the weights and routing (default 1)"},
       {"check-tokens", "N", "tokens checked per row (default 8)"},
       {"no-check", "", "skip the checks (rows say unchecked)"},
       {"cpu-kernel", "PATH", "CPU grouped_mm kernel: amx, avx512bf16, avx512, avx2 or portable"},
       {"json", "", "one JSON object per row instead of the table"}}};
  Args a(argv, kUsage);
  Device dev = parse_device(a.get_or("device", "cpu"));
  require_device(dev);
  const std::string dtype_arg = a.get_or("dtype", "bfloat16");
  QuantScheme quant;
  if (dtype_arg == "fp8" || dtype_arg == "fp4") {
    const std::string fmt = a.get_or("scale-fmt", dtype_arg == "fp4" ? "ue8m0" : "float");
    if (fmt != "float" && fmt != "ue8m0")
      throw InvalidInput("--scale-fmt must be float or ue8m0, got '" + fmt + "'");
    if (dtype_arg == "fp4" && fmt != "ue8m0")
      throw InvalidInput("fp4 experts have ue8m0 scales only");
    quant.kind = dtype_arg == "fp8" ? QuantScheme::Kind::kFp8E4M3 : QuantScheme::Kind::kFp4E2M1;
    quant.scale_dtype = fmt == "ue8m0" ? DType::kF8E8M0 : DType::kF32;
    quant.block_n = dtype_arg == "fp8" ? 128 : 1;
    quant.block_k = dtype_arg == "fp8" ? 128 : 32;
  } else if (a.has("scale-fmt")) {
    throw InvalidInput("--scale-fmt needs --dtype fp8 or fp4");
  }
  // The activation dtype (quantized weights: bfloat16 activations).
  DType dt = quant.quantized() ? DType::kBF16 : parse_dtype(dtype_arg);
  const std::string dt_name = quant.quantized() ? dtype_arg : std::string(dtype_name(dt));
  ExpertsSpec probe;
  probe.quant = quant;
  std::string shape_name = a.get_or("shape", "qwen1.5-moe-a2.7b");
  NamedShape sh{"custom", 0, 0, 0, 0};
  if (a.has("experts") || a.has("hidden") || a.has("intermediate") || a.has("top-k")) {
    sh = {"custom", a.get_int("experts", 0), a.get_int("top-k", 0), a.get_int("hidden", 0),
          a.get_int("intermediate", 0)};
    if (sh.E <= 0 || sh.k <= 0 || sh.H <= 0 || sh.I <= 0 || sh.k > sh.E)
      throw InvalidInput("a custom shape needs --experts E --top-k K --hidden H --intermediate I "
                         "with positive values and K <= E");
  } else {
    bool found = false;
    std::string names;
    for (auto& s : kShapes) {
      names += std::string(names.empty() ? "" : ", ") + s.name;
      if (shape_name == s.name) sh = s, found = true;
    }
    if (!found) throw InvalidInput("unknown --shape '" + shape_name + "'; known: " + names);
  }
  std::vector<int64_t> tokens = a.get_int_list("tokens", {1, 4, 16, 64, 256, 1024, 4096});
  for (int64_t t : tokens)
    if (t < 0) throw InvalidInput("--tokens entries must be >= 0");
  std::vector<std::string> backends = a.get_list("backends", {});
  if (backends.empty())
    for (auto& n : experts_backend_names())
      if (get_experts_backend(n)->unsupported_reason(probe, dt, dev).empty())
        backends.push_back(n);
  const GraphMode graph_mode = parse_graph_mode(a.get_or("graph", dev.is_cuda() ? "both" : "off"));
  if (!dev.is_cuda() && graph_mode != GraphMode::kOff)
    throw InvalidInput("--graph on|both needs --device cuda (graphs are CUDA graphs)");
  // --graph on times replays only: a backend that cannot be captured would have no row at all.
  if (graph_mode == GraphMode::kOn)
    for (const std::string& b : backends)
      if (!get_experts_backend(b)->caps().graph_capturable)
        throw InvalidInput("backend '" + b + "' cannot be captured in a CUDA graph: time it with --graph off or both");
  const bool json = a.has("json"), check = !a.has("no-check");
  const int64_t check_tokens = a.get_int("check-tokens", 8);
  if (check_tokens < 1) throw InvalidInput("--check-tokens must be >= 1 (--no-check skips the check)");
  const int min_iters = int(a.get_int("min-iters", 5));
  const double budget_s = a.get_positive_double("budget-s", 1.0);
  if (min_iters < 1) throw InvalidInput("--min-iters must be >= 1");
  // Given ceilings replace the measured ones (0: measure); read here, before anything is measured.
  double bw_gbs = a.get_positive_double("bandwidth-gbs", 0), peak_tflops = a.get_positive_double("peak-tflops", 0);
  const uint64_t seed = parse_seed(a.get("seed"), 1);
  // --cpu-kernel: grouped_mm on the CPU runs that kernel path (registered explicitly for this
  // process), and the peak ceiling is the one of that path's family.
  std::optional<CpuKernelPath> cpu_kernel;
  if (a.has("cpu-kernel")) {
    if (!dev.is_cpu()) throw InvalidInput("--cpu-kernel needs --device cpu");
    cpu_kernel = parse_cpu_kernel_path(a.require("cpu-kernel"));
    register_experts_backend("grouped_mm", make_cpu_grouped_mm_backend(*cpu_kernel));
  }

  ExpertsSpec spec;
  spec.num_experts = sh.E;
  spec.hidden = sh.H;
  spec.intermediate = sh.I;
  spec.quant = quant;
  const size_t es = dtype_size(dt);
  // Stored bytes per weight, and per expert the bytes of its scales.
  const double weight_es = quant.kind == QuantScheme::Kind::kFp8E4M3   ? 1.0
                           : quant.kind == QuantScheme::Kind::kFp4E2M1 ? 0.5
                                                                       : double(es);
  double scale_bytes = 0;
  if (quant.quantized()) {
    const double sb = double(dtype_size(quant.scale_dtype));
    const double bn = double(quant.block_n), bk = double(quant.block_k);
    scale_bytes = sb * (2.0 * std::ceil(double(sh.I) / bn) * std::ceil(double(sh.H) / bk) +
                        std::ceil(double(sh.H) / bn) * std::ceil(double(sh.I) / bk));
  }
  // Memory check before anything is allocated: the weights (made on the host, also for a GPU
  // run) and the activations of the largest token count. Computed in floating point, which
  // cannot wrap around: once the total is below the limit, every integer size below is far
  // from overflowing int64.
  const int64_t max_T = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  const double expert_bytes =
      (2.0 * double(sh.I) * double(sh.H) + double(sh.H) * double(sh.I)) * weight_es + scale_bytes;
  const double weight_bytes = expert_bytes * double(sh.E);
  // Per token: hidden in and out (out counted as float32), the routing (int64 id + float32
  // weight per slot) and the backends' float32 intermediates (gate_up rows + activated rows).
  const double act_bytes =
      double(max_T) * (double(sh.H) * double(es + 4) +
                       double(sh.k) * (12.0 + 4.0 * (2.0 * double(sh.I) + double(sh.I))));
  {
    const double avail = double(sysconf(_SC_AVPHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
    auto gb = [](double b) {
      char t[32];
      std::snprintf(t, sizeof t, "%.3g", b / 1e9);
      return std::string(t);
    };
    if (weight_bytes + act_bytes > 0.8 * avail)
      throw Unsupported("shape " + std::string(sh.name) + " (E=" + std::to_string(sh.E) + " k=" +
                        std::to_string(sh.k) + " H=" + std::to_string(sh.H) + " I=" +
                        std::to_string(sh.I) + ") needs " + gb(weight_bytes + act_bytes) +
                        " GB of host memory in " + dt_name + " (weights " +
                        gb(weight_bytes) + " GB + activations " + gb(act_bytes) + " GB at " +
                        std::to_string(max_T) + " tokens), more than 80 % of the " + gb(avail) +
                        " GB available on this machine");
  }
  for (auto& b : backends) {  // fail before the expensive setup
    auto be = get_experts_backend(b);
    if (auto why = be->unsupported_reason(spec, dt, dev); !why.empty())
      throw Unsupported("experts backend '" + b + "' cannot run on " + dev.str() + " in " +
                        dt_name + ": it " + why);
  }
  const int64_t R = spec.gate_up_rows();

  // Ceilings, measured here unless given.
  CeilingsOptions copt;
  copt.bandwidth = bw_gbs <= 0;
  copt.peak = peak_tflops <= 0;
  copt.cpu_kernel = cpu_kernel;
  // The CPU engine packs bfloat16 and float32 experts only: float16 runs the portable loops, so
  // its peak is the portable path's, not the packed kernel's the CPU would pick.
  const bool f16_unpacked = dev.is_cpu() && !quant.quantized() && dt == DType::kF16;
  if (f16_unpacked) copt.cpu_kernel = CpuKernelPath::kPortable;
  const bool fp8_tensor_cores = dev.is_cuda() && quant.kind == QuantScheme::Kind::kFp8E4M3;
  const Ceilings ceilings = measure_ceilings(
      dev, fp8_tensor_cores ? DType::kBF16 : quant.quantized() ? DType::kF32 : dt, copt);
  if (copt.bandwidth) bw_gbs = ceilings.bandwidth_gbps();
  if (copt.peak) peak_tflops = ceilings.peak_tflops * (fp8_tensor_cores ? 2.0 : 1.0);
  const std::string kernel = ceilings.unit + (fp8_tensor_cores && copt.peak ? ", FP8 peak = 2 x bf16" : "") +
                             (f16_unpacked ? " (float16 experts are not packed)" : "");
  if (!json)
    std::printf("# shape %s (E=%lld k=%lld H=%lld I=%lld) %s on %s [%s]; ceilings: %.1f GB/s, "
                "%.1f TFLOP/s%s\n",
                sh.name, (long long)sh.E, (long long)sh.k, (long long)sh.H, (long long)sh.I,
                dt_name.c_str(), dev.str().c_str(), kernel.c_str(), bw_gbs, peak_tflops,
                dev.is_cuda() ? ("; L2 flush: " + cuda_l2_flush()).c_str() : "");
  const std::string switches = measuring_switches_set();  // carried by every row
  if (!json && !switches.empty()) std::printf("# measuring switches set: %s\n", switches.c_str());

  ExpertsWeights w;
  if (quant.quantized()) {
    w = random_quantized_experts_weights(spec, seed);
  } else {
    w.gate_up = random_tensor(spec.gate_up_shape(), dt, 1.f / std::sqrt(float(sh.H)), seed);
    w.down = random_tensor(spec.down_shape(), dt, 1.f / std::sqrt(float(sh.I)), seed + 1);
  }
  ExpertsWeights w_host = w;
  if (!dev.host_accessible())
    for (Tensor* t : {&w.gate_up, &w.down, &w.gate_up_scale, &w.down_scale})
      if (t->defined()) *t = t->to(dev);
  Experts experts(spec, w);
  Experts experts_host(spec, w_host);
  CacheEvictor evictor;


  if (!json)
    std::printf("%-12s %6s %6s %10s %10s %9s %9s %9s %10s %11s\n", "backend", "tokens", "graph",
                "ms", "floor_ms", "fraction", "TFLOP/s", "GB/s", "check_err", "scratch_MB");
  for (int64_t T : tokens) {
    Routing r = make_routing(T, sh.k, sh.E, seed + 100 + uint64_t(T));
    Tensor hidden = random_tensor({T, sh.H}, dt, 1.f, seed + 7 + uint64_t(T));
    Tensor hd = hidden, idxd = r.idx, wd = r.w;
    if (!dev.host_accessible()) {
      hd = hidden.to(dev);
      idxd = r.idx.to(dev);
      wd = r.w.to(dev);
    }
    const double bytes = double(r.distinct) * expert_bytes + 2.0 * double(T * sh.H) * double(es) +
                         double(T * sh.k) * 12.0;
    const double flops = 2.0 * double(T * sh.k) * double(R * sh.H + sh.H * sh.I);
    // The floor is computed when this T's rows are printed (below): on the CPU the bandwidth may
    // be measured again first.
    struct Row {
      std::string backend;
      bool graph;
      double ms;
      std::optional<double> err;
      size_t scratch;
    };
    std::vector<Row> timed;

    // Check sample: tokens spread over [0, T).
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < std::min(T, check_tokens); ++i) rows.push_back(i * T / std::min(T, check_tokens));
    Tensor eager_rows;
    if (check && T > 0) {
      Tensor hs = take_rows(hidden, rows), is = take_rows(r.idx, rows), ws = take_rows(r.w, rows);
      eager_rows = experts_host.forward("eager", hs, is, ws);
      QuantizedReference ref = experts_reference_f64_bounded(spec, w_host, hs, is, ws);
      double err = rel_l2_error(eager_rows, ref.out), tol = experts_tolerance(dt, std::max(sh.H, sh.I));
      // Quantized: the reference's bound for elements near an e4m3 midpoint (0 when none is).
      if (ref.crossing_bound > 0) {
        double norm = 0;
        for (int64_t i = 0; i < int64_t(ref.out.numel()); ++i)
          norm += ref.out.data<double>()[i] * ref.out.data<double>()[i];
        if (norm > 0) tol += ref.crossing_bound / std::sqrt(norm);
      }
      if (!(err <= tol))
        throw Error("check failed: eager differs from the float64 reference by " +
                    std::to_string(err) + " (tolerance " + std::to_string(tol) + ") at T=" +
                    std::to_string(T));
    }
    const bool checked = check && T > 0;
    // Relative error of `out`'s sample rows against eager's; throws naming the check when it
    // exceeds the tolerance, so that a wrong result is never timed.
    auto check_rows = [&](const Tensor& out, const std::string& b, const char* how) {
      const double err = rel_l2_error(take_rows(out, rows), eager_rows);
      const double tol = 2 * experts_tolerance(dt, std::max(sh.H, sh.I));
      if (!(err <= tol))
        throw Error("check failed: backend '" + b + "'" + how + " differs from eager by " +
                    std::to_string(err) + " (tolerance " + std::to_string(tol) + ") at T=" +
                    std::to_string(T) + "; not timing a wrong result");
      return err;
    };
    for (const std::string& b : backends) {
      std::optional<double> err;
      if (checked) err = check_rows(experts.forward(b, hd, idxd, wd), b, "");
      // CUDA: the scratch memory one call of this size holds (the workspace it asks for,
      // allocated through a caller's workspace here): the activation memory a fused path saves.
      size_t scratch = 0;
      if (dev.is_cuda()) {
        Workspace ws(dev);
        ExecContext ctx = ExecContext::on(dev);
        ctx.workspace = &ws;
        Tensor o = Tensor::empty(hd.shape(), hd.dtype(), dev);
        experts.forward(b, hd, idxd, wd, o, ctx);
        (void)o.to(Device::cpu());  // (the call has finished before its workspace is freed)
        scratch = ws.capacity();
      }
      std::vector<bool> graph_modes;
      if (graph_mode != GraphMode::kOn) graph_modes.push_back(false);
      if (graph_mode != GraphMode::kOff) graph_modes.push_back(true);
      for (bool g : graph_modes) {
        auto fn = [&] { (void)experts.forward(b, hd, idxd, wd); };
        double ms = 0;
        std::optional<double> row_err = err;
        if (dev.is_cpu()) {
          ms = time_cpu_ms(fn, evictor, min_iters, budget_s);
        } else {
          if (g && !get_experts_backend(b)->caps().graph_capturable) continue;
          // The replays are what is timed, so a replay's output is what must be right.
          if (g && checked) {
            auto call = [&] { return experts.forward(b, hd, idxd, wd); };
            row_err = check_rows(graph_replay_output(dev, call), b, " replayed from a CUDA graph");
          }
          ms = time_cuda_ms(dev, fn, g, 3, std::max(min_iters, 20));
        }
        timed.push_back({b, g, ms, row_err, scratch});
      }
    }
    // A shared host's DRAM bandwidth moves within seconds (on a 2-core cloud VM the same
    // measurement read 22 and 79 GB/s minutes apart), and a ceiling read in a slow moment makes
    // fractions over 100 %. So on the CPU the bandwidth is measured again after each T's timings
    // and the highest reading so far is the ceiling of the rows printed from then on.
    if (copt.bandwidth && dev.is_cpu()) {
      CeilingsOptions again = copt;
      again.peak = false;
      const double now = measure_ceilings(dev, DType::kF32, again).bandwidth_gbps();
      if (now > bw_gbs) {
        bw_gbs = now;
        if (!json)
          std::printf("# bandwidth measured again after the T=%lld timings: %.1f GB/s, the "
                      "ceiling from here on\n",
                      (long long)T, bw_gbs);
      }
    }
    const double floor_ms = std::max(bytes / (bw_gbs * 1e9), flops / (peak_tflops * 1e12)) * 1e3;
    for (const Row& row : timed) {
      const std::string& b = row.backend;
      const bool g = row.graph;
      const double ms = row.ms;
      const std::optional<double>& row_err = row.err;
      double frac = ms > 0 ? floor_ms / ms : 0;
      if (json) {
        nlohmann::json j{{"backend", b}, {"device", dev.str()}, {"dtype", dt_name},
                         {"shape", sh.name}, {"experts", sh.E}, {"top_k", sh.k},
                         {"hidden", sh.H}, {"intermediate", sh.I}, {"tokens", T},
                         {"graph", g}, {"ms", ms}, {"floor_ms", floor_ms},
                         {"fraction_of_floor", frac}, {"bytes", bytes}, {"flops", flops},
                         {"distinct_experts", r.distinct}, {"bandwidth_gbs", bw_gbs},
                         {"peak_tflops", peak_tflops}, {"kernel", kernel},
                         {"scratch_bytes", row.scratch},
                         {"check_rel_err",
                          row_err ? nlohmann::json(*row_err) : nlohmann::json()}};
        if (dev.is_cuda()) j["l2_flush"] = cuda_l2_flush();
        j["measuring_switches"] = switches;
        std::printf("%s\n", j.dump().c_str());
      } else {
        char err_text[32] = "unchecked";
        if (row_err) std::snprintf(err_text, sizeof err_text, "%.2e", *row_err);
        char scratch_text[32] = "-";
        if (row.scratch) std::snprintf(scratch_text, sizeof scratch_text, "%.1f", row.scratch / 1e6);
        std::printf("%-12s %6lld %6s %10.4f %10.4f %8.1f%% %9.2f %9.1f %10s %11s\n", b.c_str(),
                    (long long)T, g ? "on" : "off", ms, floor_ms, 100 * frac,
                    ms > 0 ? flops / ms / 1e9 : 0, ms > 0 ? bytes / ms / 1e6 : 0, err_text,
                    scratch_text);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

int run_bench(const std::vector<std::string>& argv) {
  if (!argv.empty() && argv[0] == "generate")
    return run_bench_generate(std::vector<std::string>(argv.begin() + 1, argv.end()));
  if (!argv.empty() && argv[0] == "experts")
    return run_bench_experts(std::vector<std::string>(argv.begin() + 1, argv.end()));
  if (!argv.empty() && argv[0] == "comm")
    return run_bench_comm(std::vector<std::string>(argv.begin() + 1, argv.end()));
  const std::string subcommands =
      "usage: moex bench generate --model DIR [flags]   end-to-end generation speed with floors\n"
      "       moex bench experts [flags]                experts backends on synthetic weights\n"
      "       moex bench comm --ep-size N [flags]       expert-parallel collectives over NCCL\n"
      "       moex bench SUBCOMMAND --help              the subcommand's flags\n";
  if (!argv.empty() && (argv[0] == "--help" || argv[0] == "-h")) throw HelpRequested(subcommands);
  throw InvalidInput(argv.empty() ? "missing subcommand: generate, experts or comm; see moex bench --help"
                                  : "unknown subcommand '" + argv[0] + "': generate, experts or comm; see moex bench --help");
}

Registration reg({"bench", "benchmark generation end to end (bench generate) or experts backends (bench experts)",
                  run_bench});

}  // namespace
}  // namespace moex::cli
