// The BPE model of tokenizer.json: vocab, ranked merges, unk / byte_fallback / fuse_unk /
// ignore_merges. Unsupported: dropout > 0, continuing_subword_prefix, end_of_word_suffix.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/components.hpp"

namespace moex::text {

class Bpe {
 public:
  Bpe(const json& model, const Where& w);
  // Appends the ids of one pre-tokenized word.
  void encode_word(const std::string& word, std::vector<int64_t>& out) const;
  const std::unordered_map<std::string, int64_t>& vocab() const { return vocab_; }

 private:
  struct PairHash {
    size_t operator()(uint64_t k) const { return std::hash<uint64_t>()(k); }
  };
  static uint64_t key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }

  std::unordered_map<std::string, int64_t> vocab_;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>, PairHash> merges_;
  int64_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  int64_t byte_ids_[256];  // id of <0xNN>, or -1
};

}  // namespace moex::text
