// BPE: a word starts as one symbol per character and the adjacent pair with the lowest merge rank
// is merged until no pair has a merge; among equal ranks (the same pair) the leftmost goes first.
// A heap of candidate merges keyed by (rank, position) gives that order in O(n log n); stale
// entries (a side already merged away) are skipped when popped.
#include "text/bpe.hpp"

#include <queue>

#include "moex/error.hpp"
#include "text/utf8.hpp"

namespace moex::text {

Bpe::Bpe(const json& m, const Where& w) {
  const json& d = field(m, "dropout", w);
  if (!d.is_null() && !(d.is_number() && d.get<double>() == 0.0)) unsupported(w.at("dropout"), "BPE dropout");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = m.find(k);
    if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      unsupported(w.at(k), std::string("BPE ") + k);
  }
  const json& vocab = field(m, "vocab", w);
  if (!vocab.is_object()) throw InvalidInput(w.at("vocab").str() + ": expected an object");
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX)
      throw InvalidInput(w.at("vocab").at(it.key()).str() + ": expected a non-negative id");
    vocab_[it.key()] = it.value().get<int64_t>();
  }
  const json& merges = field(m, "merges", w);
  if (!merges.is_array()) throw InvalidInput(w.at("merges").str() + ": expected an array");
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    const Where we = w.at("merges").at(r);
    std::string a, b;
    // Two spellings exist: ["a", "b"] (tokenizers >= 0.20) and "a b".
    if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        throw InvalidInput(we.str() + ": expected \"left right\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      throw InvalidInput(we.str() + ": expected a pair of strings");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
      throw InvalidInput(we.str() + ": merge of '" + a + "' and '" + b + "' uses a token not in the vocab");
    merges_.emplace(key(ia->second, ib->second), std::make_pair(static_cast<int64_t>(r), iab->second));
  }
  auto unk = m.find("unk_token");
  if (unk != m.end() && !unk->is_null()) {
    if (!unk->is_string()) throw InvalidInput(w.at("unk_token").str() + ": expected a string");
    auto it = vocab_.find(unk->get<std::string>());
    if (it == vocab_.end()) throw InvalidInput(w.at("unk_token").str() + ": '" + unk->get<std::string>() + "' is not in the vocab");
    unk_id_ = it->second;
  }
  byte_fallback_ = bool_field(m, "byte_fallback", w, false);
  fuse_unk_ = bool_field(m, "fuse_unk", w, false);
  ignore_merges_ = bool_field(m, "ignore_merges", w, false);
  static const char* kHex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string t = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    auto it = vocab_.find(t);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

void Bpe::encode_word(const std::string& word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int64_t> sym;
  // A pending unk (fused over consecutive unknown characters when fuse_unk).
  bool unk_pending = false;
  for (size_t i = 0; i < word.size();) {
    size_t n = utf8_valid_len(word, i);
    if (n == 0) n = 1;  // byte-level and normalized text is UTF-8; stay total regardless
    auto it = vocab_.find(word.substr(i, n));
    if (it != vocab_.end()) {
      if (unk_pending) sym.push_back(unk_id_), unk_pending = false;
      sym.push_back(it->second);
    } else {
      bool done = false;
      if (byte_fallback_) {
        bool all = true;
        for (size_t k = 0; k < n; ++k) all = all && byte_ids_[static_cast<unsigned char>(word[i + k])] >= 0;
        if (all) {
          // As `tokenizers` does, a pending unk is not flushed before the byte tokens.
          for (size_t k = 0; k < n; ++k) sym.push_back(byte_ids_[static_cast<unsigned char>(word[i + k])]);
          done = true;
        }
      }
      if (!done && unk_id_ >= 0) {
        if (unk_pending && !fuse_unk_) sym.push_back(unk_id_);
        unk_pending = true;
      }
    }
    i += n;
  }
  if (unk_pending) sym.push_back(unk_id_);

  const size_t n = sym.size();
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int>(i + 1) : -1;
  }
  struct Cand {
    int64_t rank;
    int pos;
    int64_t new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int p) {
    if (p < 0 || next[p] < 0) return;
    auto it = merges_.find(key(sym[p], sym[next[p]]));
    if (it != merges_.end()) heap.push({it->second.first, p, it->second.second});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int>(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const int r = next[c.pos];
    auto it = merges_.find(key(sym[c.pos], sym[r]));
    if (it == merges_.end() || it->second.second != c.new_id) continue;
    sym[c.pos] = c.new_id;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int i = n ? 0 : -1; i >= 0; i = next[i]) out.push_back(sym[i]);
}

}  // namespace moex::text
