// libFuzzer target for the safetensors header parser (parse_safetensors_header).
//
// Each input is tried twice:
//  1. as a whole file, exactly as read from disk;
//  2. as "JSON header, a NUL byte, data": the harness writes the correct 8-byte length itself, so
//     mutations of the JSON are not wasted on a length prefix that no longer matches.
// The parser must either return entries that satisfy the format's invariants or throw
// moex::InvalidInput; any other exception escapes and libFuzzer reports it as a crash, and
// ASan/UBSan report any out-of-bounds read or undefined behaviour.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "moex/error.hpp"
#include "moex/safetensors.hpp"

namespace {

// Checks what callers rely on: every tensor lies inside the file, entries come sorted by offset
// and cover the data region exactly.
void check_invariants(const std::vector<moex::SafetensorsEntry>& entries, size_t size,
                      uint64_t data_start) {
  if (data_start < 8 || data_start > size) std::abort();
  uint64_t cursor = 0;
  for (const auto& e : entries) {
    if (e.begin != cursor || e.end < e.begin || e.end > size - data_start) std::abort();
    cursor = e.end;
  }
  if (cursor != size - data_start) std::abort();
}

void try_parse(const uint8_t* data, size_t size) {
  uint64_t data_start = 0;
  std::map<std::string, std::string> metadata;
  try {
    const auto entries = moex::parse_safetensors_header(data, size, &data_start, &metadata, "fuzz");
    check_invariants(entries, size, data_start);
  } catch (const moex::InvalidInput&) {
    // The expected outcome for almost every input.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try_parse(data, size);

  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t json_len = nul ? size_t(nul - data) : size;
  const size_t rest = nul ? size - json_len - 1 : 0;
  // An exact-size heap buffer, so ASan catches a read one byte past the end.
  std::vector<uint8_t> file(8 + json_len + rest);
  for (int i = 0; i < 8; ++i) file[size_t(i)] = uint8_t(uint64_t(json_len) >> (8 * i));
  if (json_len) std::memcpy(file.data() + 8, data, json_len);
  if (rest) std::memcpy(file.data() + 8 + json_len, nul + 1, rest);
  try_parse(file.data(), file.size());
  return 0;
}
