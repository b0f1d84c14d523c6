// Reading safetensors files, memory-mapped, with every field validated before use.
//
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:
// [begin, end]}, "__metadata__": {...}}, then the data region. Validation (each failure throws
// InvalidInput naming the file and, where there is one, the tensor): file shorter than 8 bytes;
// N past the end of the file or absurdly large; header not a JSON object; unknown dtype; negative
// or non-integer shape entries; shape product overflow; begin > end; end past the data region;
// (end - begin) != numel * element size; overlapping tensors; bytes of the data region that belong
// to no tensor (the spec forbids holes); duplicate keys anywhere; `__metadata__` not an object of
// strings; nesting deeper than the format uses. See docs/loading.md for the full table.
// For FP4 packed tensors the shape is the stored byte shape (dtype "I8"/"U8" + config tells FP4).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moex/tensor.hpp"

namespace moex {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // offsets into the data region
  uint64_t end = 0;
};

// One memory-mapped file. Tensors returned by get() alias the mapping (read-only; the mapping
// stays alive while any of them does), so loading needs no second copy of the weights.
class SafetensorsFile {
 public:
  // Throws InvalidInput (bad format) or Error (cannot open/map, naming the path and errno text).
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  // Parses an in-memory buffer (tests, fuzzing); the buffer is copied.
  static std::shared_ptr<SafetensorsFile> from_bytes(const void* data, size_t size,
                                                     const std::string& label = "<memory>");

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // Throws InvalidInput "tensor 'x' not found in FILE".
  const SafetensorsEntry& entry(const std::string& name) const;
  // A CPU tensor aliasing the file's bytes (read-only memory: writing through it faults). Only a
  // tensor whose bytes are not aligned to its element size is copied (never the case for files
  // from the reference writer or save_safetensors).
  Tensor get(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<Storage> mapping_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  friend class SafetensorsParser;
};

// Parses and validates a header; used by SafetensorsFile and by the fuzz target.
// `file_size` is the total size of the file (header length prefix included).
std::vector<SafetensorsEntry> parse_safetensors_header(const uint8_t* data, size_t file_size,
                                                       uint64_t* data_start,
                                                       std::map<std::string, std::string>* metadata,
                                                       const std::string& label);

// Writes tensors (host, any dtype) to a safetensors file; used by the CLI's --out and by tests.
// A regular file (or a missing one, or a link to a regular file) is replaced only once the new
// file is complete (a temporary file in the same folder, renamed into place; removed on failure);
// a character device or a FIFO with a reader (/dev/null, /dev/stdout, a pipe) is written through.
// Throws InvalidInput for a folder, a socket, a dangling link or a FIFO without a reader, and
// Error naming the path for failed writes.
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// safetensors dtype strings: "F32", "BF16", "F16", "F64", "F8_E4M3", "F8_E8M0", "I8", "U8",
// "I16", "I32", "I64", "BOOL". Throws InvalidInput for others.
DType safetensors_dtype(const std::string& s);
std::string safetensors_dtype_name(DType t);

}  // namespace moex
