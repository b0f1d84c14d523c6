// libFuzzer target for SafetensorsFile::get() on files the parser accepted: tensors at any byte
// offset (a header whose length is not a multiple of 8 misaligns every tensor, which get() must
// copy rather than hand out a misaligned typed view) and of every dtype, 8-bit floats and packed
// FP4 included.
//
// Each input is read as "JSON header, a NUL byte, data" (the harness writes the length prefix, so
// mutations are not wasted on it); the first byte, when it is a digit, pads the header with that
// many spaces first, to move the data region off alignment. For every accepted file, every tensor
// must have the shape and byte size its entry declares, be aligned to its element size, and hold
// exactly the file's bytes; floating tensors are also converted to float (every element read
// through its dtype). Anything else aborts; ASan/UBSan report out-of-bounds or undefined reads.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "moex/error.hpp"
#include "moex/safetensors.hpp"

namespace {

void check_file(const std::vector<uint8_t>& file) {
  std::shared_ptr<moex::SafetensorsFile> f;
  try {
    f = moex::SafetensorsFile::from_bytes(file.data(), file.size(), "fuzz");
  } catch (const moex::InvalidInput&) {
    return;  // the expected outcome for almost every input
  }
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | file[size_t(i)];
  const uint64_t data_start = 8 + header;
  for (const auto& [name, e] : f->entries()) {
    const moex::Tensor t = f->get(name);
    if (t.dtype() != e.dtype || t.shape() != e.shape) std::abort();
    if (t.nbytes() != e.end - e.begin || e.end > file.size() - data_start) std::abort();
    if (reinterpret_cast<uintptr_t>(t.raw()) % moex::dtype_size(t.dtype()) != 0) std::abort();
    if (t.nbytes() && std::memcmp(t.raw(), file.data() + data_start + e.begin, t.nbytes()) != 0)
      std::abort();
    if (moex::is_floating(t.dtype()) && t.dtype() != moex::DType::kFP4x2) {
      const std::vector<float> v = t.to_float_vector();
      if (v.size() != size_t(t.numel())) std::abort();
      (void)t.to(moex::DType::kF32);
    } else if (t.dtype() != moex::DType::kFP4x2) {
      if (t.to_int_vector().size() != size_t(t.numel())) std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t pad = 0;
  if (size && data[0] >= '0' && data[0] <= '9') {
    pad = size_t(data[0] - '0');
    ++data;
    --size;
  }
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t json_len = nul ? size_t(nul - data) : size;
  const size_t rest = nul ? size - json_len - 1 : 0;
  std::vector<uint8_t> file(8 + json_len + pad + rest);
  const uint64_t n = json_len + pad;
  for (int i = 0; i < 8; ++i) file[size_t(i)] = uint8_t(n >> (8 * i));
  if (json_len) std::memcpy(file.data() + 8, data, json_len);
  std::memset(file.data() + 8 + json_len, ' ', pad);  // JSON allows trailing spaces
  if (rest) std::memcpy(file.data() + 8 + n, nul + 1, rest);
  check_file(file);
  return 0;
}
