// The safetensors header parser: the only code that reads untrusted bytes of a weights file.
//
// Everything is checked before any offset is used, with 64-bit overflow checks on every sum and
// product, and the rules of the format's own reference implementation: the data region must be
// covered exactly by the tensors, in any order, without holes or overlaps (the spec forbids holes
// so that a file cannot double as another format). It depends on nothing but the JSON library
// and the error types, so the fuzz target links it alone with full instrumentation.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string_view>

#include "io/strict_json.hpp"
#include "moex/error.hpp"
#include "moex/safetensors.hpp"

namespace moex {
namespace {

struct DTypeInfo {
  std::string_view name;
  DType dtype;
  uint64_t size;
};

// The safetensors dtype strings moex maps onto its DType; FP4 packed weights travel as I8/U8.
constexpr DTypeInfo kDTypes[] = {
    {"F32", DType::kF32, 4},        {"F16", DType::kF16, 2},         {"BF16", DType::kBF16, 2},
    {"F64", DType::kF64, 8},        {"F8_E4M3", DType::kF8E4M3, 1},  {"F8_E8M0", DType::kF8E8M0, 1},
    {"I8", DType::kI8, 1},          {"U8", DType::kU8, 1},           {"I16", DType::kI16, 2},
    {"I32", DType::kI32, 4},        {"I64", DType::kI64, 8},         {"BOOL", DType::kBool, 1},
};

// The reference implementation's cap; real headers are far smaller (DeepSeek-V3: ~10 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// root object -> tensor object -> shape array: nothing legitimate nests deeper.
constexpr int kMaxHeaderDepth = 3;

const DTypeInfo* find_dtype(std::string_view s) {
  for (const auto& d : kDTypes)
    if (d.name == s) return &d;
  return nullptr;
}

std::string known_dtypes() {
  std::string out;
  for (const auto& d : kDTypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

// Shapes in messages without depending on the core's shape_str (the fuzz target links this alone).
std::string dims_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A JSON value that must be a non-negative integer fitting int64 (or uint64 for offsets).
bool as_u64(const nlohmann::json& v, uint64_t limit, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x < 0) return false;
    *out = uint64_t(x);
  } else {
    return false;
  }
  return *out <= limit;
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& v,
                             uint64_t data_size, const std::string& label) {
  const std::string where = label + ": tensor '" + name + "': ";
  if (!v.is_object())
    throw InvalidInput(where + "expected an object, got " + io::json_type_name(v));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) throw InvalidInput(where + "missing field '" + field + "'");

  SafetensorsEntry e;
  e.name = name;
  const auto& jd = v["dtype"];
  if (!jd.is_string())
    throw InvalidInput(where + "dtype must be a string, got " + io::json_type_name(jd));
  const DTypeInfo* info = find_dtype(jd.get_ref<const std::string&>());
  if (!info)
    throw InvalidInput(where + "unknown dtype '" + jd.get<std::string>() + "' (supported: " +
                       known_dtypes() + ")");
  e.dtype = info->dtype;

  const auto& js = v["shape"];
  if (!js.is_array())
    throw InvalidInput(where + "shape must be an array, got " + io::json_type_name(js));
  // `numel` is the element count; `span` multiplies the non-zero dims only, which the row-major
  // strides reach even when a zero dim leaves the tensor empty: both must fit in int64.
  uint64_t numel = 1, span = 1;
  constexpr uint64_t kMax = uint64_t(std::numeric_limits<int64_t>::max());
  for (const auto& d : js) {
    uint64_t n = 0;
    if (!as_u64(d, kMax, &n))
      throw InvalidInput(where + "shape " + js.dump() +
                         " must hold non-negative integers below 2^63");
    e.shape.push_back(int64_t(n));
    if (__builtin_mul_overflow(numel, n, &numel) || numel > kMax ||
        __builtin_mul_overflow(span, n ? n : 1, &span) || span > kMax)
      throw InvalidInput(where + "shape " + js.dump() + " has too many elements");
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, info->size, &nbytes))
    throw InvalidInput(where + "shape " + js.dump() + " is too large in bytes");

  const auto& jo = v["data_offsets"];
  if (!jo.is_array() || jo.size() != 2)
    throw InvalidInput(where + "data_offsets must be [begin, end], got " + jo.dump());
  if (!as_u64(jo[0], std::numeric_limits<uint64_t>::max(), &e.begin) ||
      !as_u64(jo[1], std::numeric_limits<uint64_t>::max(), &e.end))
    throw InvalidInput(where + "data_offsets " + jo.dump() + " must be non-negative integers");
  if (e.begin > e.end)
    throw InvalidInput(where + "data_offsets " + jo.dump() + " have begin > end");
  if (e.end > data_size)
    throw InvalidInput(where + "data_offsets " + jo.dump() + " end past the data region (" +
                       std::to_string(data_size) + " bytes)");
  if (e.end - e.begin != nbytes)
    throw InvalidInput(where + "holds " + std::to_string(e.end - e.begin) + " bytes but " +
                       std::string(info->name) + dims_str(e.shape) + " needs " +
                       std::to_string(nbytes));
  return e;
}

void parse_metadata(const nlohmann::json& m, std::map<std::string, std::string>* out,
                    const std::string& label) {
  if (m.is_null()) return;  // the reference writer's "no metadata"
  if (!m.is_object())
    throw InvalidInput(label + ": __metadata__ must be an object of strings, got " +
                       io::json_type_name(m));
  for (const auto& [k, v] : m.items()) {
    if (!v.is_string())
      throw InvalidInput(label + ": __metadata__ value of '" + k + "' must be a string, got " +
                         io::json_type_name(v));
    if (out) (*out)[k] = v.get<std::string>();
  }
}

}  // namespace

DType safetensors_dtype(const std::string& s) {
  const DTypeInfo* info = find_dtype(s);
  if (!info)
    throw InvalidInput("unknown safetensors dtype '" + s + "' (supported: " + known_dtypes() +
                       ")");
  return info->dtype;
}

std::string safetensors_dtype_name(DType t) {
  // Packed FP4 is stored as int8 bytes, as the hub checkpoints do; the config says it is FP4.
  if (t == DType::kFP4x2) return "I8";
  for (const auto& d : kDTypes)
    if (d.dtype == t) return std::string(d.name);
  throw InvalidInput("dtype " + std::to_string(int(t)) + " has no safetensors name");
}

std::vector<SafetensorsEntry> parse_safetensors_header(const uint8_t* data, size_t file_size,
                                                       uint64_t* data_start,
                                                       std::map<std::string, std::string>* metadata,
                                                       const std::string& label) {
  if (file_size < 8)
    throw InvalidInput(label + ": file is " + std::to_string(file_size) +
                       " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian whatever the host
  if (n > file_size - 8)
    throw InvalidInput(label + ": header length " + std::to_string(n) + " runs past the end of the " +
                       std::to_string(file_size) + "-byte file");
  if (n > kMaxHeaderBytes)
    throw InvalidInput(label + ": header length " + std::to_string(n) + " exceeds the limit of " +
                       std::to_string(kMaxHeaderBytes) + " bytes");

  const nlohmann::json header = io::parse_json_strict(reinterpret_cast<const char*>(data + 8),
                                                      size_t(n), label, kMaxHeaderDepth);
  if (!header.is_object())
    throw InvalidInput(label + ": header must be a JSON object, got " +
                       io::json_type_name(header));

  const uint64_t data_size = file_size - 8 - n;
  std::vector<SafetensorsEntry> entries;
  entries.reserve(header.size());
  if (metadata) metadata->clear();
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      parse_metadata(value, metadata, label);
      continue;
    }
    entries.push_back(parse_entry(name, value, data_size, label));
  }

  // Coverage: sorted by offsets, each tensor must start where the previous one ended.
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : entries) {
    if (e.begin < cursor)
      throw InvalidInput(label + ": tensor '" + e.name + "' [" + std::to_string(e.begin) + ", " +
                         std::to_string(e.end) + ") overlaps tensor '" + prev->name + "' [" +
                         std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ")");
    if (e.begin > cursor)
      throw InvalidInput(label + ": tensor '" + e.name + "' starts at " + std::to_string(e.begin) +
                         " but bytes [" + std::to_string(cursor) + ", " + std::to_string(e.begin) +
                         ") of the data region belong to no tensor");
    cursor = e.end;
    prev = &e;
  }
  if (cursor != data_size)
    throw InvalidInput(label + ": the data region has " + std::to_string(data_size) +
                       " bytes but the tensors cover only " + std::to_string(cursor));
  *data_start = 8 + n;
  return entries;
}

}  // namespace moex
