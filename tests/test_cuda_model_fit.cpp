// A checkpoint whose weights do not fit the GPU is refused before anything is allocated there,
// with one error naming the bytes needed and free, by the library and by the CLI (exit code 2).
// The checkpoint is the qwen2_moe fixture plus one 256 GB tensor in a sparse second shard (the
// file's data region is a hole: nothing is written to disk and nothing needs reading, since the
// check runs on the shapes).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "moex/bench.hpp"
#include "moex/error.hpp"
#include "moex/model.hpp"
#include "moex/safetensors.hpp"
#include "support/test_support.hpp"

namespace moex {
namespace {

namespace fs = std::filesystem;

std::string make_oversized_checkpoint() {
  const fs::path src = test::data_path("hf-tiny/qwen2_moe/checkpoint_bf16");
  const fs::path dir = fs::temp_directory_path() / "moex_oversized_checkpoint";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(src / "config.json", dir / "config.json");
  // The fixture's tensors as the first shard of an index (the single-file name would shadow it).
  fs::copy_file(src / "model.safetensors", dir / "model-00001.safetensors");
  // huge.safetensors: one bf16 tensor [2^20, 2^17] = 256 GiB, its data a hole.
  const uint64_t rows = uint64_t(1) << 20, cols = uint64_t(1) << 17, bytes = rows * cols * 2;
  nlohmann::json header = {{"model.layers.0.mlp.experts.unused_but_counted",
                            {{"dtype", "BF16"}, {"shape", {rows, cols}}, {"data_offsets", {0, bytes}}}}};
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  {
    std::ofstream f(dir / "huge.safetensors", std::ios::binary);
    const uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(h.data(), std::streamsize(h.size()));
  }
  fs::resize_file(dir / "huge.safetensors", 8 + h.size() + bytes);
  nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
  const auto fixture = SafetensorsFile::open((src / "model.safetensors").string());  // outlives the loop
  for (const auto& [name, e] : fixture->entries())
    index["weight_map"][name] = "model-00001.safetensors";
  index["weight_map"]["model.layers.0.mlp.experts.unused_but_counted"] = "huge.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  return dir.string();
}

TEST(CudaModelFit, TooLargeIsRefusedBeforeAllocating) {
  if (test::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = make_oversized_checkpoint();
  LoadOptions o;
  o.dtype = DType::kBF16;
  o.device = Device::cuda(0);
  const int64_t before = peak_memory_bytes(Device::cuda(0));
  try {
    from_pretrained(dir, o);
    FAIL() << "an oversized checkpoint loaded";
  } catch (const DeviceError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("GB on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("are free"), std::string::npos) << m;
  }
  EXPECT_EQ(peak_memory_bytes(Device::cuda(0)), before);  // nothing was allocated

  const auto r = test::run_cli("info --model " + dir + " --device cuda --dtype bfloat16", ::testing::TempDir());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("are free"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moex
