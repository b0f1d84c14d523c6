// safetensors reading and writing: round trips of every dtype, memory-mapped aliasing, and one
// test per kind of malformed file (each must throw InvalidInput naming the file and the tensor;
// under the sanitizer build none may read out of bounds). Files are built byte by byte here.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moex/error.hpp"
#include "moex/safetensors.hpp"
#include "test_safetensors_util.hpp"

namespace moex {
namespace {

using test::expect_invalid;
using test::make_safetensors;

const std::string kLabel = "bad.safetensors";

std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(i * 7 + 1);
  return v;
}

// The file must be rejected, with a message naming the file and containing `parts`.
void expect_bad(const std::vector<uint8_t>& bytes, std::vector<std::string> parts) {
  parts.push_back(kLabel);
  expect_invalid([&] { SafetensorsFile::from_bytes(bytes.data(), bytes.size(), kLabel); }, parts);
}
void expect_bad_header(const std::string& header, size_t data_bytes,
                       const std::vector<std::string>& parts) {
  expect_bad(make_safetensors(header, iota_bytes(data_bytes)), parts);
}

std::string w_entry(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return R"({"w":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets +
         "}}";
}

// ---------------------------------------------------------------- round trips

TEST(Safetensors, RoundTripEveryDtypeAliasesTheMapping) {
  const uint64_t seed = 20261129;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Case {
    DType dtype;
    Shape shape;
    const char* st_name;
  };
  const std::vector<Case> cases = {
      {DType::kF32, {3, 5}, "F32"},         {DType::kBF16, {7}, "BF16"},
      {DType::kF16, {1, 1, 19}, "F16"},     {DType::kF64, {}, "F64"},
      {DType::kF8E4M3, {11, 3}, "F8_E4M3"}, {DType::kF8E8M0, {5}, "F8_E8M0"},
      {DType::kI8, {2, 9}, "I8"},           {DType::kU8, {0, 4}, "U8"},
      {DType::kI16, {3}, "I16"},            {DType::kI32, {2, 2}, "I32"},
      {DType::kI64, {2, 11}, "I64"},        {DType::kBool, {13}, "BOOL"},
  };
  std::map<std::string, Tensor> tensors;
  for (size_t i = 0; i < cases.size(); ++i) {
    Tensor t = Tensor::empty(cases[i].shape, cases[i].dtype);
    auto* p = static_cast<uint8_t*>(t.raw());
    for (size_t b = 0; b < t.nbytes(); ++b) p[b] = uint8_t(rng());
    if (cases[i].dtype == DType::kBool)
      for (size_t b = 0; b < t.nbytes(); ++b) p[b] &= 1;  // a bool byte holds 0 or 1
    tensors["t" + std::to_string(i) + "." + cases[i].st_name] = t;
  }
  test::TempDir dir;
  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors, {{"format", "pt"}, {"note", "round trip"}});

  auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->path(), path);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "round trip");
  ASSERT_EQ(file->entries().size(), cases.size());
  std::shared_ptr<Storage> mapping;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = "t" + std::to_string(i) + "." + cases[i].st_name;
    SCOPED_TRACE(name);
    ASSERT_TRUE(file->contains(name));
    EXPECT_EQ(file->entry(name).dtype, cases[i].dtype);
    EXPECT_EQ(safetensors_dtype(cases[i].st_name), cases[i].dtype);
    EXPECT_EQ(safetensors_dtype_name(cases[i].dtype), cases[i].st_name);
    const Tensor got = file->get(name);
    EXPECT_EQ(got.dtype(), cases[i].dtype);
    EXPECT_EQ(got.shape(), cases[i].shape);
    EXPECT_TRUE(got.is_contiguous());
    ASSERT_EQ(got.nbytes(), tensors[name].nbytes());
    EXPECT_EQ(std::memcmp(got.raw(), tensors[name].raw(), got.nbytes()), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.raw()) % dtype_size(got.dtype()), 0u)
        << "the writer must align every tensor to its element size";
    // Every tensor is a view of the one mapping of the file: no copy was made.
    if (!mapping) mapping = got.storage();
    EXPECT_EQ(got.storage(), mapping);
  }
  EXPECT_GE(mapping->bytes(), 8u);
}

TEST(Safetensors, TensorsKeepTheMappingAliveAfterTheFileIsGone) {
  test::TempDir dir;
  const std::string path = dir.file("one.safetensors");
  save_safetensors(path, {{"x", Tensor::from_floats({1.5f, -2.f, 3.25f}, {3})}});
  Tensor x = SafetensorsFile::open(path)->get("x");  // the SafetensorsFile dies here
  EXPECT_EQ(x.to_float_vector(), (std::vector<float>{1.5f, -2.f, 3.25f}));
}

TEST(Safetensors, Fp4PackedBytesAreWrittenAsI8) {
  Tensor t = Tensor::empty({2, 3}, DType::kFP4x2);
  for (int i = 0; i < 6; ++i) t.data<uint8_t>()[i] = uint8_t(0x1f + i);
  test::TempDir dir;
  save_safetensors(dir.file("fp4.safetensors"), {{"w", t}});
  auto file = SafetensorsFile::open(dir.file("fp4.safetensors"));
  EXPECT_EQ(file->entry("w").dtype, DType::kI8);
  EXPECT_EQ(file->entry("w").shape, (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(file->get("w").raw(), t.raw(), 6), 0);
}

TEST(Safetensors, NonContiguousTensorsAreSavedInLogicalOrder) {
  Tensor m = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  test::TempDir dir;
  save_safetensors(dir.file("t.safetensors"), {{"mt", m.transpose(0, 1)}});
  Tensor got = SafetensorsFile::open(dir.file("t.safetensors"))->get("mt");
  EXPECT_EQ(got.shape(), (Shape{3, 2}));
  EXPECT_EQ(got.to_float_vector(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

TEST(Safetensors, EmptyFileHeaderScalarsAndZeroSizedTensors) {
  auto empty = make_safetensors("{}", {});
  EXPECT_TRUE(SafetensorsFile::from_bytes(empty.data(), empty.size())->entries().empty());
  // A zero-sized tensor may sit at the same offset as the next one without overlapping it.
  const std::string h =
      R"({"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},)"
      R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"__metadata__":null})";
  const float v = 2.5f;
  std::vector<uint8_t> data(4);
  std::memcpy(data.data(), &v, 4);
  auto bytes = make_safetensors(h, data);
  auto file = SafetensorsFile::from_bytes(bytes.data(), bytes.size());
  EXPECT_EQ(file->get("z").numel(), 0);
  EXPECT_EQ(file->get("s").dim(), 0);
  EXPECT_EQ(file->get("s").to_float_vector(), std::vector<float>{2.5f});
  EXPECT_TRUE(file->metadata().empty());
}

TEST(Safetensors, MisalignedTensorIsCopiedToAlignedMemory) {
  // Header length 57 puts the data region at byte 65: legal, but an F32 there is misaligned.
  std::string h = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  h.append(57 - h.size(), ' ');
  const float vals[2] = {3.f, -7.5f};
  std::vector<uint8_t> data(8);
  std::memcpy(data.data(), vals, 8);
  auto bytes = make_safetensors(h, data);
  auto file = SafetensorsFile::from_bytes(bytes.data(), bytes.size());
  Tensor w = file->get("w");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.raw()) % 4, 0u);
  EXPECT_EQ(w.to_float_vector(), (std::vector<float>{3.f, -7.5f}));
}

TEST(Safetensors, WriterRejectsReservedNameAndUndefinedTensor) {
  test::TempDir dir;
  expect_invalid([&] { save_safetensors(dir.file("a"), {{"__metadata__", Tensor::zeros({1}, DType::kF32)}}); },
                 {"__metadata__"});
  expect_invalid([&] { save_safetensors(dir.file("b"), {{"u", Tensor()}}); }, {"'u'", "undefined"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("a")));
}

// ---------------------------------------------------------------- malformed files

TEST(SafetensorsBad, FileShorterThanTheLengthPrefix) {
  for (size_t n = 0; n < 8; ++n) expect_bad(std::vector<uint8_t>(n, 0), {"shorter than the 8-byte"});
  // The same through the file system (mmap cannot map an empty file; open must still say why).
  test::TempDir dir;
  for (size_t n : {0, 3, 7}) {
    const std::string p = dir.file("short" + std::to_string(n));
    test::write_bytes(p, std::vector<uint8_t>(n, 0x41));
    expect_invalid([&] { SafetensorsFile::open(p); }, {p, "shorter than the 8-byte"});
  }
}

TEST(SafetensorsBad, MissingFileIsAnErrorNamingThePath) {
  test::TempDir dir;
  const std::string p = dir.file("nope.safetensors");
  try {
    SafetensorsFile::open(p);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  expect_invalid([&] { SafetensorsFile::open(dir.str()); }, {"not a regular file"});
}

TEST(SafetensorsBad, HeaderLengthPastTheEnd) {
  const std::string h = w_entry(R"("F32")", "[4]", "[0,16]");
  expect_bad(make_safetensors(h, iota_bytes(16), h.size() + 17), {"runs past the end"});
  // Values near 2^64 must not wrap around in the bounds arithmetic.
  for (uint64_t n : {std::numeric_limits<uint64_t>::max(), std::numeric_limits<uint64_t>::max() - 7,
                     uint64_t(1) << 63})
    expect_bad(make_safetensors(h, iota_bytes(16), n), {"runs past the end"});
  test::TempDir dir;
  const std::string p = dir.file("long_header.safetensors");
  test::write_bytes(p, make_safetensors(h, iota_bytes(16), h.size() + 100));
  expect_invalid([&] { SafetensorsFile::open(p); }, {p, "runs past the end"});
}

TEST(SafetensorsBad, HeaderLengthOverTheLimit) {
  // A sparse file (no disk used) long enough that the length fits, but over the 100 MB cap.
  test::TempDir dir;
  const std::string p = dir.file("huge_header.safetensors");
  test::write_bytes(p, make_safetensors("", {}, uint64_t(100'000'001)));
  std::filesystem::resize_file(p, 8 + 100'000'001);
  expect_invalid([&] { SafetensorsFile::open(p); }, {p, "exceeds the limit of 100000000 bytes"});
}

TEST(SafetensorsBad, HeaderNotAJsonObject) {
  expect_bad_header("", 0, {"invalid JSON"});
  expect_bad_header("{\"w\":", 0, {"invalid JSON"});
  expect_bad_header("[1, 2, 3]", 0, {"must be a JSON object", "array"});
  expect_bad_header("\"text\"", 0, {"must be a JSON object"});
  expect_bad_header(w_entry(R"("F32")", "[4]", "[0,16]") + " trailing", 16, {"invalid JSON"});
  expect_bad_header(std::string("{\"w\0\":1}", 9), 0, {"invalid JSON"});       // NUL byte
  expect_bad_header("{\"\xff\xfe\":{}}", 0, {"invalid JSON"});                   // not UTF-8
  expect_bad_header("{/* comment */}", 0, {"invalid JSON"});
}

TEST(SafetensorsBad, DeepNestingIsRejectedNotRecursedInto) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  expect_bad_header(deep, 0, {"nested deeper"});
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[[4]],"data_offsets":[0,16]}})", 16,
                    {"nested deeper"});
}

TEST(SafetensorsBad, UnknownOrMalformedDtype) {
  expect_bad_header(w_entry(R"("F8_E5M2")", "[4]", "[0,4]"), 4,
                    {"tensor 'w'", "unknown dtype 'F8_E5M2'", "F8_E4M3"});
  expect_bad_header(w_entry(R"("f32")", "[4]", "[0,16]"), 16, {"tensor 'w'", "unknown dtype 'f32'"});
  expect_bad_header(w_entry("4", "[4]", "[0,16]"), 16, {"tensor 'w'", "dtype must be a string"});
}

TEST(SafetensorsBad, BadShape) {
  expect_bad_header(w_entry(R"("F32")", "[-1]", "[0,4]"), 4, {"tensor 'w'", "non-negative"});
  expect_bad_header(w_entry(R"("F32")", "[2.0]", "[0,8]"), 8, {"tensor 'w'", "non-negative integers"});
  expect_bad_header(w_entry(R"("F32")", R"(["2"])", "[0,8]"), 8, {"tensor 'w'"});
  expect_bad_header(w_entry(R"("F32")", "4", "[0,16]"), 16, {"tensor 'w'", "shape must be an array"});
  expect_bad_header(w_entry(R"("F32")", "[18446744073709551615]", "[0,4]"), 4, {"tensor 'w'"});
  // Overflow of the element count and of the byte count must be caught, not wrapped.
  expect_bad_header(w_entry(R"("F32")", "[4294967296,4294967296,4]", "[0,0]"), 0,
                    {"tensor 'w'", "too many elements"});
  // An empty tensor whose other dims multiply past 2^63: its row-major strides would overflow.
  expect_bad_header(w_entry(R"("BF16")", "[0,18446744073709,516153]", "[0,0]"), 0,
                    {"tensor 'w'", "too many elements"});
  expect_bad_header(w_entry(R"("F32")", "[4611686018427387904]", "[0,0]"), 0,
                    {"tensor 'w'", "too large in bytes"});
}

TEST(SafetensorsBad, BadOffsets) {
  expect_bad_header(w_entry(R"("F32")", "[4]", "[16,0]"), 16, {"tensor 'w'", "begin > end"});
  expect_bad_header(w_entry(R"("F32")", "[4]", "[0]"), 16, {"tensor 'w'", "[begin, end]"});
  expect_bad_header(w_entry(R"("F32")", "[4]", "[0,16,32]"), 16, {"tensor 'w'", "[begin, end]"});
  expect_bad_header(w_entry(R"("F32")", "[4]", R"([0,"16"])"), 16, {"tensor 'w'", "non-negative"});
  expect_bad_header(w_entry(R"("F32")", "[4]", "[-16,0]"), 16, {"tensor 'w'", "non-negative"});
}

TEST(SafetensorsBad, OffsetsOutOfRange) {
  expect_bad_header(w_entry(R"("F32")", "[8]", "[0,32]"), 16,
                    {"tensor 'w'", "past the data region (16 bytes)"});
  expect_bad_header(w_entry(R"("F32")", "[4]", "[18446744073709551600,18446744073709551615]"), 16,
                    {"tensor 'w'", "past the data region"});
}

TEST(SafetensorsBad, SizeDoesNotMatchShapeAndDtype) {
  expect_bad_header(w_entry(R"("F32")", "[2,2]", "[0,12]"), 12,
                    {"tensor 'w'", "holds 12 bytes but F32[2, 2] needs 16"});
  expect_bad_header(w_entry(R"("BF16")", "[2,2]", "[0,16]"), 16, {"tensor 'w'", "needs 8"});
}

TEST(SafetensorsBad, OverlappingTensors) {
  expect_bad_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                    R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                    24, {"'b'", "overlaps", "'a'"});
  expect_bad_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                    R"("b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                    16, {"overlaps"});
  // A zero-sized tensor inside another tensor's bytes is an overlap too.
  expect_bad_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                    R"("z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})",
                    16, {"'z'", "overlaps"});
}

TEST(SafetensorsBad, HolesAndTrailingBytesInTheDataRegion) {
  expect_bad_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
                    24, {"'b'", "belong to no tensor"});
  expect_bad_header(w_entry(R"("F32")", "[4]", "[0,16]"), 20, {"20 bytes", "cover only 16"});
}

TEST(SafetensorsBad, DuplicateKeys) {
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                    R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                    8, {"duplicate key 'w'"});
  expect_bad_header(R"({"__metadata__":{"a":"1","a":"2"}})", 0, {"duplicate key 'a'"});
  expect_bad_header(R"({"w":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4,
                    {"duplicate key 'dtype'"});
}

TEST(SafetensorsBad, Metadata) {
  expect_bad_header(R"({"__metadata__":{"format":1}})", 0,
                    {"__metadata__ value of 'format' must be a string", "integer"});
  expect_bad_header(R"({"__metadata__":{"format":null}})", 0, {"'format' must be a string"});
  expect_bad_header(R"({"__metadata__":["pt"]})", 0, {"__metadata__ must be an object"});
}

TEST(SafetensorsBad, EntryShape) {
  expect_bad_header(R"({"w":3})", 0, {"tensor 'w'", "expected an object"});
  expect_bad_header(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4,
                    {"tensor 'w'", "missing field 'dtype'"});
  expect_bad_header(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4,
                    {"tensor 'w'", "missing field 'shape'"});
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[1]}})", 4,
                    {"tensor 'w'", "missing field 'data_offsets'"});
}

TEST(SafetensorsBad, MissingTensorNamesTheFile) {
  auto bytes = make_safetensors(w_entry(R"("F32")", "[4]", "[0,16]"), iota_bytes(16));
  auto file = SafetensorsFile::from_bytes(bytes.data(), bytes.size(), "some.safetensors");
  expect_invalid([&] { file->get("nope"); }, {"'nope'", "some.safetensors"});
  expect_invalid([&] { safetensors_dtype("Q4_K"); }, {"'Q4_K'"});
}

// Every proper prefix of a valid file is invalid, and none may be read past its end (ASan).
TEST(SafetensorsBad, EveryTruncationOfAValidFileIsRejected) {
  test::TempDir dir;
  const std::string path = dir.file("v.safetensors");
  save_safetensors(path, {{"a", Tensor::from_floats({1, 2, 3}, {3})},
                          {"b", Tensor::from_ints({4, 5}, {2})}},
                   {{"format", "pt"}});
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> full((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GT(full.size(), 8u);
  EXPECT_EQ(SafetensorsFile::from_bytes(full.data(), full.size())->entries().size(), 2u);
  for (size_t n = 0; n < full.size(); ++n) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " bytes");
    // An exact-size copy, so that reading one byte too far is a heap overflow ASan reports.
    std::vector<uint8_t> prefix(full.begin(), full.begin() + std::ptrdiff_t(n));
    expect_invalid([&] { SafetensorsFile::from_bytes(prefix.data(), prefix.size(), kLabel); }, {kLabel});
  }
}

// Random corruption of a valid file: each result is a clean InvalidInput or a file whose tensors
// all lie inside it. A small, seeded, deterministic cousin of the libFuzzer target. Every variant
// is held in a buffer of exactly its size and parsed from there (from_bytes also copies into an
// exact-size allocation), so that under AddressSanitizer a read past the end is reported.
TEST(SafetensorsBad, RandomCorruptionsFailCleanly) {
  test::TempDir dir;
  const std::string path = dir.file("v.safetensors");
  save_safetensors(path, {{"a", Tensor::from_floats({1, 2, 3, 4}, {2, 2})},
                          {"b", Tensor::from_floats({5, 6}, {2}, DType::kBF16)},
                          {"c", Tensor::from_ints({7}, {1})}});
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> full((std::istreambuf_iterator<char>(in)), {});
  const uint64_t seed = 1234567;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bytes = full;
    // No flips: a bare truncation, which leaves a valid header and cuts the data region short.
    const int flips = int(rng() % 5);
    for (int f = 0; f < flips; ++f) {
      // Mostly the header (where the parser looks), sometimes the length prefix.
      const size_t pos = rng() % 5 == 0 ? rng() % 8 : rng() % bytes.size();
      bytes[pos] = rng() % 2 ? uint8_t(rng()) : uint8_t("{}[]\",:0123456789-e. "[rng() % 21]);
    }
    if (flips == 0 || rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    const size_t n = bytes.size();
    const auto exact = std::make_unique<uint8_t[]>(n);
    if (n) std::memcpy(exact.get(), bytes.data(), n);
    try {
      auto file = SafetensorsFile::from_bytes(exact.get(), n, kLabel);
      ++accepted;
      // The parser's own view of the same bytes: where the data region starts, and each
      // tensor's byte range, which must lie inside the file and match its shape and dtype.
      uint64_t data_start = 0;
      std::map<std::string, std::string> metadata;
      const auto entries = parse_safetensors_header(exact.get(), n, &data_start, &metadata, kLabel);
      ASSERT_GE(data_start, 8u) << "iteration " << iter;
      ASSERT_LE(data_start, n) << "iteration " << iter;
      ASSERT_EQ(entries.size(), file->entries().size()) << "iteration " << iter;
      for (const auto& e : entries) {
        SCOPED_TRACE("iteration " + std::to_string(iter) + " tensor '" + e.name + "'");
        ASSERT_LE(e.begin, e.end);
        ASSERT_LE(e.end, n - data_start) << "tensor ends past the file (" << n << " bytes)";
        ASSERT_EQ(e.end - e.begin, uint64_t(shape_numel(e.shape)) * dtype_size(e.dtype));
        const SafetensorsEntry& f = file->entry(e.name);
        ASSERT_EQ(f.begin, e.begin);
        ASSERT_EQ(f.end, e.end);
        Tensor t = file->get(e.name);
        ASSERT_EQ(t.nbytes(), e.end - e.begin);
        // The bytes get() returns are the file's bytes at that range.
        ASSERT_EQ(std::memcmp(t.raw(), exact.get() + data_start + e.begin, t.nbytes()), 0);
      }
    } catch (const InvalidInput& e) {
      ASSERT_NE(std::string(e.what()).find(kLabel), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": unexpected exception type: " << e.what();
    }
  }
  EXPECT_GT(accepted, 0) << "no corruption survived; the test no longer reaches the success path";
}

}  // namespace
}  // namespace moex
