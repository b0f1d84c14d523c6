#include "cli/args.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "moex/comm.hpp"
#include "moex/error.hpp"

namespace moex::cli {

int64_t parse_int(const std::string& s, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    throw InvalidInput("invalid integer '" + s + "' for " + what);
  return v;
}

double parse_double(const std::string& s, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    throw InvalidInput("invalid number '" + s + "' for " + what + (std::isfinite(v) ? "" : " (finite values only)"));
  return v;
}

namespace {

bool is_help(const std::string& word) { return word == "--help" || word == "-h"; }

const Flag* find_flag(const std::vector<Flag>& flags, const std::string& name) {
  for (const auto& f : flags)
    if (f.name == name) return &f;
  return nullptr;
}

// "--name=value" -> {"name", "value", true}; "--name" -> {"name", "", false}.
struct Word {
  std::string name, value;
  bool inline_value = false;
};
Word split_flag(const std::string& word) {
  Word w{word.substr(2), "", false};
  if (auto eq = w.name.find('='); eq != std::string::npos) {
    w.value = w.name.substr(eq + 1);
    w.name = w.name.substr(0, eq);
    w.inline_value = true;
  }
  return w;
}

const Flag kHelpFlag{"help", "", "print this help and exit (also -h)"};

}  // namespace

bool wants_help(const std::vector<std::string>& argv, const std::vector<Flag>& flags) {
  for (size_t i = 0; i < argv.size(); ++i) {
    if (is_help(argv[i])) return true;
    if (argv[i].rfind("--", 0) != 0) continue;
    const Word w = split_flag(argv[i]);
    const Flag* f = find_flag(flags, w.name);
    // The next word is this flag's value, unless it is a flag (which the parser rejects as a value).
    if (f && !f->value.empty() && !w.inline_value && i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) ++i;
  }
  return false;
}

std::string help_text(const Usage& u) {
  std::string s = "usage: moex " + u.command + (u.synopsis.empty() ? "" : " " + u.synopsis) + "\n";
  if (!u.about.empty()) s += "\n" + u.about + (u.about.back() == '\n' ? "" : "\n");
  std::vector<Flag> all = u.flags;
  all.push_back(kHelpFlag);
  size_t width = 0;
  for (const auto& f : all) width = std::max(width, f.name.size() + (f.value.empty() ? 0 : f.value.size() + 1));
  s += "\nflags:\n";
  for (const auto& f : all) {
    std::string left = "--" + f.name + (f.value.empty() ? "" : " " + f.value);
    left.resize(width + 4, ' ');
    s += "  " + left + f.help + "\n";
  }
  return s;
}

Args::Args(const std::vector<std::string>& argv, const Usage& usage) {
  if (wants_help(argv, usage.flags)) throw HelpRequested(help_text(usage));
  const std::string see = "; see moex " + usage.command + " --help";
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& word = argv[i];
    if (word.rfind("--", 0) != 0)
      throw InvalidInput("unexpected argument '" + word + "' (values follow their flag: --name value)" + see);
    Word w = split_flag(word);
    const Flag* f = find_flag(usage.flags, w.name);
    if (!f) {
      std::string known;
      for (const auto& k : usage.flags) known += " --" + k.name;
      throw InvalidInput("unknown flag --" + w.name + "; known:" + known);
    }
    if (values_.count(w.name) || switches_.count(w.name)) throw InvalidInput("--" + w.name + " given twice");
    if (f->value.empty()) {
      if (w.inline_value) throw InvalidInput("flag --" + w.name + " takes no value");
      switches_.insert(w.name);
      continue;
    }
    if (!w.inline_value) {
      if (i + 1 >= argv.size()) throw InvalidInput("missing value for --" + w.name);
      // A flag where a value should be is a forgotten value far more often than a value that
      // starts with "--"; the "=" form says the latter unambiguously.
      if (argv[i + 1].rfind("--", 0) == 0)
        throw InvalidInput("missing value for --" + w.name + " (found the flag " + argv[i + 1] +
                           "; write --" + w.name + "=VALUE for a value that starts with --)");
      w.value = argv[++i];
    }
    if (w.value.empty() && !f->allow_empty) throw InvalidInput("empty value for --" + w.name);
    values_[w.name] = w.value;
  }
}

bool Args::has(const std::string& name) const {
  return switches_.count(name) || values_.count(name);
}
std::optional<std::string> Args::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}
std::string Args::get_or(const std::string& name, const std::string& dflt) const {
  auto v = get(name);
  return v ? *v : dflt;
}
std::string Args::require(const std::string& name) const {
  auto v = get(name);
  if (!v) throw InvalidInput("missing required flag --" + name);
  return *v;
}
int64_t Args::get_int(const std::string& name, int64_t dflt) const {
  auto v = get(name);
  return v ? parse_int(*v, "--" + name) : dflt;
}
double Args::get_double(const std::string& name, double dflt) const {
  auto v = get(name);
  return v ? parse_double(*v, "--" + name) : dflt;
}
double Args::get_positive_double(const std::string& name, double dflt) const {
  const double v = get_double(name, dflt);
  if (has(name) && !(v > 0)) throw InvalidInput("--" + name + " must be > 0, got " + *get(name));
  return v;
}
std::vector<std::string> Args::get_list(const std::string& name,
                                        std::vector<std::string> dflt) const {
  auto v = get(name);
  if (!v) return dflt;
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t c = v->find(',', start);
    std::string item = v->substr(start, c == std::string::npos ? std::string::npos : c - start);
    if (item.empty()) throw InvalidInput("empty entry in --" + name + " '" + *v + "'");
    out.push_back(item);
    if (c == std::string::npos) break;
    start = c + 1;
  }
  return out;
}
std::vector<int64_t> Args::get_int_list(const std::string& name,
                                        std::vector<int64_t> dflt) const {
  if (!get(name)) return dflt;
  std::vector<int64_t> out;
  for (const auto& s : get_list(name, {})) out.push_back(parse_int(s, "--" + name));
  return out;
}

std::vector<Flag> load_flags() {
  return {
      {"model", "DIR", "checkpoint folder: config.json, *.safetensors (tokenizer.json for text)"},
      {"dtype", "D", "weights and activations: float32 or bfloat16 (default: the checkpoint's)"},
      {"device", "DEV", "cpu (default), cuda or cuda:I"},
      {"experts-implementation", "SPEC",
       "experts backend: a name (moex backends) or JSON {\"\": B, \"text_config\": B, ...}"},
      {"dequantize", "", "block-quantized (FP8/FP4) checkpoints: convert every quantized weight to "
                         "the model dtype at load"},
      {"shared-experts-stream", "MODE", "auto|on|off: CUDA: shared experts on a second stream beside "
                                        "the routed ones (auto: decode-sized calls)"},
  };
}

LoadOptions load_options(const Args& a) {
  LoadOptions o = make_load_options(a.get_or("dtype", ""), a.get_or("device", ""),
                                    a.get_or("experts-implementation", ""));
  o.dequantize = a.has("dequantize");
  const std::string side = a.get_or("shared-experts-stream", "auto");
  if (side == "auto") o.shared_experts_stream = SharedExpertsStream::kAuto;
  else if (side == "on") o.shared_experts_stream = SharedExpertsStream::kOn;
  else if (side == "off") o.shared_experts_stream = SharedExpertsStream::kOff;
  else throw InvalidInput("--shared-experts-stream must be auto, on or off, got '" + side + "'");
  return o;
}

std::vector<Flag> ep_flags() {
  return {
      {"ep-size", "N", "expert parallelism: N ranks, each holding 1/N of the routed experts (threads "
                       "on the CPU; on GPUs rank r on cuda:r, or one process per GPU under moex launch)"},
      {"ep-mode", "MODE", "replicated (default: every rank runs all tokens on its experts, outputs "
                          "summed) or all-to-all (rows dispatched to the experts' ranks; host models)"},
      {"tp-size", "N", "tensor parallelism of attention and dense layers: N ranks, each holding 1/N of "
                       "the heads and dense columns, partial outputs summed (with --ep-size N: the same ranks)"},
  };
}

namespace {

// RANK / WORLD_SIZE / LOCAL_RANK as `moex launch` (and torchrun, mpirun wrappers) set them, with
// the rendezvous file of moex launch. world = 0: not launched.
struct LaunchedRank {
  int rank = 0, world = 0, local = 0;
  std::string rendezvous;
};

LaunchedRank launched_rank() {
  LaunchedRank r;
  const char* world = std::getenv("WORLD_SIZE");
  if (!world || !*world) return r;
  auto env_int = [](const char* name, const char* value) {
    if (!value || !*value) throw InvalidInput(std::string("WORLD_SIZE is set but ") + name + " is not");
    return int(parse_int(value, std::string("the environment variable ") + name));
  };
  r.world = env_int("WORLD_SIZE", world);
  r.rank = env_int("RANK", std::getenv("RANK"));
  const char* local = std::getenv("LOCAL_RANK");
  r.local = local && *local ? env_int("LOCAL_RANK", local) : r.rank;
  if (r.world < 1 || r.rank < 0 || r.rank >= r.world || r.local < 0)
    throw InvalidInput("RANK " + std::to_string(r.rank) + ", LOCAL_RANK " + std::to_string(r.local) +
                       " and WORLD_SIZE " + std::to_string(r.world) + " do not make a rank");
  if (const char* f = std::getenv("MOEX_RENDEZVOUS")) r.rendezvous = f;
  return r;
}

ExpertParallelMode parse_ep_mode(const std::string& mode) {
  if (mode != "replicated" && mode != "all-to-all")
    throw InvalidInput("--ep-mode must be replicated or all-to-all, got '" + mode + "'");
  return mode == "all-to-all" ? ExpertParallelMode::kAllToAll : ExpertParallelMode::kReplicated;
}

}  // namespace

void run_ep_ranks(const Args& a, const LoadOptions& options,
                  const std::function<void(LoadOptions&, bool lead)>& body) {
  const ExpertParallelMode mode = parse_ep_mode(a.get_or("ep-mode", "replicated"));
  const LaunchedRank launched = launched_rank();
  const int64_t ep = a.get_int("ep-size", launched.world > 1 ? launched.world : 1);
  const int64_t tp = a.get_int("tp-size", 1);
  if (ep < 1 || ep > 1024) throw InvalidInput("--ep-size must be between 1 and 1024, got " + std::to_string(ep));
  if (tp < 1 || tp > 1024) throw InvalidInput("--tp-size must be between 1 and 1024, got " + std::to_string(tp));
  // One group of ranks serves both: each size is 1 or the group's.
  const int64_t n = std::max(ep, tp);
  if (ep != 1 && tp != 1 && ep != tp)
    throw InvalidInput("--ep-size " + std::to_string(ep) + " and --tp-size " + std::to_string(tp) +
                       " differ: the two run on the same ranks (give one of them, or equal sizes)");
  auto set_comms = [&](LoadOptions& o, Communicator* c) {
    o.ep_comm = ep > 1 ? c : nullptr;
    o.tp_comm = tp > 1 ? c : nullptr;
    o.ep_mode = mode;
  };

  // One process per rank (moex launch): this process is rank RANK on GPU LOCAL_RANK.
  if (launched.world > 1) {
    if (n != launched.world)
      throw InvalidInput(std::string(ep >= tp ? "--ep-size " : "--tp-size ") + std::to_string(n) + " but " +
                         std::to_string(launched.world) + " processes were launched (WORLD_SIZE)");
    if (!options.device.is_cuda() || options.device.index != 0)
      throw InvalidInput("launched ranks run on GPUs, one per process (rank r on cuda:LOCAL_RANK): give "
                         "--device cuda; on the CPU run --ep-size N in one process instead");
    if (launched.rendezvous.empty())
      throw InvalidInput("WORLD_SIZE is " + std::to_string(launched.world) +
                         " but MOEX_RENDEZVOUS (the file where the ranks meet) is not set: start the "
                         "ranks with moex launch");
    const auto comm = make_nccl_rank(launched.rank, launched.world, launched.local, launched.rendezvous);
    LoadOptions o = options;
    o.device = comm->device();
    set_comms(o, comm.get());
    try {
      body(o, launched.rank == 0);
    } catch (const std::exception& e) {
      comm->abort(e.what());
      throw;
    }
    return;
  }
  if (a.has("ep-mode") && ep == 1) throw InvalidInput("--ep-mode needs --ep-size N with N > 1");
  if (n == 1) {
    LoadOptions o = options;
    body(o, true);
    return;
  }
  // N ranks in this process: threads, on the CPU or rank r on cuda:r over NCCL.
  std::vector<std::unique_ptr<Communicator>> comms;
  if (options.device.is_cuda()) {
    if (options.device.index != 0)
      throw InvalidInput("--ep-size / --tp-size " + std::to_string(n) + " on GPUs places rank r on cuda:r: give --device cuda");
    std::vector<int> devices;
    for (int r = 0; r < int(n); ++r) devices.push_back(r);
    try {
      comms = make_nccl_group(devices);
    } catch (const Unsupported& e) {
      throw Unsupported("--ep-size / --tp-size " + std::to_string(n) + " on GPUs: " + e.what());
    }
  } else {
    comms = make_thread_group(int(n));
  }
  const auto errors = run_ranks(comms, [&](Communicator& c) {
    LoadOptions o = options;
    if (o.device.is_cuda()) o.device = c.device();
    set_comms(o, &c);
    body(o, c.rank() == 0);
  });
  // The error to report: a rank's own, before the CommErrors its abort caused in the others.
  std::exception_ptr first, own;
  for (const auto& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const CommError&) {
    } catch (...) {
      if (!own) own = e;
    }
  }
  if (own) std::rethrow_exception(own);
  if (first) std::rethrow_exception(first);
}

std::vector<Flag> decode_flags() {
  return {
      {"decode-switch", "MODE", "auto|on|off: decode steps run batched_mm where grouped_mm was "
                                "asked (auto: on GPUs)"},
      {"graph", "on|off", "CUDA: replay decode steps from one captured CUDA graph (default on)"},
  };
}

void apply_decode_flags(const Args& a, moex::GenerationOptions& g) {
  const std::string graph = a.get_or("graph", "on");
  if (graph != "on" && graph != "off") throw InvalidInput("--graph must be on or off, got '" + graph + "'");
  g.cuda_graph = graph == "on";
  // The decode-stage switch (grouped_mm -> batched_mm for the decode steps): auto = on GPUs only.
  const std::string sw = a.get_or("decode-switch", "auto");
  if (sw == "auto") g.decode_switch = DecodeSwitch::kAuto;
  else if (sw == "on") g.decode_switch = DecodeSwitch::kOn;
  else if (sw == "off") g.decode_switch = DecodeSwitch::kOff;
  else throw InvalidInput("--decode-switch must be auto, on or off, got '" + sw + "'");
}

}  // namespace moex::cli
