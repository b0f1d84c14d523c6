// Greedy continuation of given prompt ids with llama.cpp's public C API (llama.h), for
// cpu_side_by_side.py: the loop of llama.cpp's examples/simple, but with token ids in and out, so
// that both engines start from the same ids and their outputs compare id by id (llama-simple and
// llama-cli take text, and random-weight models emit ids without printable text).
//
// Built by cpu_side_by_side.py against a llama.cpp build (not part of moex's build):
//   c++ -O2 -std=c++17 bench/llama_greedy.cpp -I LLAMA/include -I LLAMA/ggml/include \
//       -L LLAMA/build/bin -lllama -lggml -lggml-base -Wl,-rpath,LLAMA/build/bin -o llama_greedy
// Usage: llama_greedy MODEL.gguf THREADS NEW_TOKENS ID,ID,...
// Prints one JSON line: load_s, prefill_s (the prompt's forward and the first token's choice),
// decode_s (every later step), total_s (process start to the last token), ids (the new tokens).
// Greedy here is argmax with the lowest id on ties, as moex's and transformers' greedy are.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

llama_token argmax(const float* logits, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

std::vector<llama_token> parse_ids(const std::string& text) {
  std::vector<llama_token> ids;
  size_t s = 0;
  while (s < text.size()) {
    size_t c = text.find(',', s);
    if (c == std::string::npos) c = text.size();
    ids.push_back(llama_token(std::stol(text.substr(s, c - s))));
    s = c + 1;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  const Clock::time_point t_start = Clock::now();
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL.gguf THREADS NEW_TOKENS ID,ID,...\n", argv[0]);
    return 2;
  }
  const int threads = std::atoi(argv[2]);
  const int new_tokens = std::atoi(argv[3]);
  std::vector<llama_token> prompt = parse_ids(argv[4]);
  if (threads < 1 || new_tokens < 1 || prompt.empty()) {
    std::fprintf(stderr, "llama_greedy: threads and new tokens must be >= 1, the prompt non-empty\n");
    return 2;
  }

  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    std::fprintf(stderr, "llama_greedy: cannot load %s\n", argv[1]);
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  for (llama_token t : prompt)
    if (t < 0 || t >= n_vocab) {
      std::fprintf(stderr, "llama_greedy: prompt id %d outside [0, %d)\n", t, n_vocab);
      return 2;
    }

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(prompt.size() + size_t(new_tokens));
  cp.n_batch = uint32_t(prompt.size());
  cp.n_ubatch = uint32_t(prompt.size());
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "llama_greedy: cannot create a context\n");
    return 1;
  }
  const double load_s = seconds_since(t_start);

  std::vector<llama_token> out;
  const Clock::time_point t_prefill = Clock::now();
  if (llama_decode(ctx, llama_batch_get_one(prompt.data(), int32_t(prompt.size()))) != 0) {
    std::fprintf(stderr, "llama_greedy: prompt decode failed\n");
    return 1;
  }
  out.push_back(argmax(llama_get_logits_ith(ctx, -1), n_vocab));
  const double prefill_s = seconds_since(t_prefill);
  const Clock::time_point t_decode = Clock::now();
  while (int(out.size()) < new_tokens) {
    llama_token last = out.back();
    if (llama_decode(ctx, llama_batch_get_one(&last, 1)) != 0) {
      std::fprintf(stderr, "llama_greedy: decode step failed\n");
      return 1;
    }
    out.push_back(argmax(llama_get_logits_ith(ctx, -1), n_vocab));
  }
  const double decode_s = seconds_since(t_decode);

  std::printf("{\"load_s\": %.6f, \"prefill_s\": %.6f, \"decode_s\": %.6f, \"total_s\": %.6f, \"ids\": [", load_s,
              prefill_s, decode_s, seconds_since(t_start));
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? ", " : "", out[i]);
  std::printf("]}\n");
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
