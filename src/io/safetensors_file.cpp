// Memory-mapped safetensors files and the writer.
//
// A file is mapped once, read-only and private; tensors are views into that mapping and hold it
// alive through the shared Storage, whose release unmaps it. So loading a model costs address
// space, not a second copy in memory, and pages are read only when a tensor is touched. The
// mapping is PROT_READ on purpose: a writable private mapping of a file larger than RAM + swap can
// be refused by the kernel's overcommit accounting, and a stray write through a weight view
// should fault loudly rather than silently copy pages. The only copy made is for a tensor whose
// bytes are not aligned to its element size (a header whose length is not a multiple of 8), so
// that typed access stays defined behaviour.
//
// Truncating a file while it is mapped makes the kernel raise SIGBUS on access; no reader of
// mapped files can prevent that, so do not rewrite checkpoints that a process is using.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>

#include <nlohmann/json.hpp>

#include "io/output_file.hpp"
#include "moex/error.hpp"
#include "moex/safetensors.hpp"

namespace moex {

// Friend of SafetensorsFile: fills a file from a mapping (or an owned copy) of its bytes.
class SafetensorsParser {
 public:
  static std::shared_ptr<SafetensorsFile> build(std::shared_ptr<Storage> bytes,
                                                const std::string& label) {
    auto file = std::make_shared<SafetensorsFile>();
    file->path_ = label;
    const auto entries =
        parse_safetensors_header(static_cast<const uint8_t*>(bytes->data()), bytes->bytes(),
                                 &file->data_start_, &file->metadata_, label);
    for (const auto& e : entries) file->entries_.emplace(e.name, e);
    file->mapping_ = std::move(bytes);
    return file;
  }
};

namespace {

std::string errno_text() { return std::strerror(errno); }

// Closes the descriptor on every path out of open().
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

size_t element_alignment(DType t) {
  const size_t s = dtype_size(t);
  return s == 0 ? 1 : s;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) throw Error(path + ": cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw Error(path + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) throw InvalidInput(path + ": not a regular file");
  const size_t size = size_t(st.st_size);
  // mmap rejects length 0, and a file this short cannot be valid anyway: let the parser say why.
  if (size < 8) {
    uint64_t unused = 0;
    parse_safetensors_header(nullptr, size, &unused, nullptr, path);  // throws "shorter than 8"
    throw InvalidInput(path + ": file too short");                    // not reached
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (p == MAP_FAILED) throw Error(path + ": cannot mmap " + std::to_string(size) + " bytes: " + errno_text());
  auto storage =
      std::make_shared<Storage>(p, size, Device::cpu(), [size](void* q) { ::munmap(q, size); });
  storage->mark_file_mapped();
  return SafetensorsParser::build(std::move(storage), path);
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::from_bytes(const void* data, size_t size,
                                                             const std::string& label) {
  // A 64-byte aligned copy, so alignment behaves as for a page-aligned mapping, of exactly `size`
  // bytes: under AddressSanitizer a read one byte past the end is reported (a rounded-up
  // allocation would hide it).
  struct AlignedDelete {
    void operator()(void* q) const { ::operator delete(q, std::align_val_t{64}); }
  };
  std::unique_ptr<void, AlignedDelete> copy(::operator new(size, std::align_val_t{64}));
  if (size) std::memcpy(copy.get(), data, size);
  auto exact = std::make_shared<Storage>(copy.get(), size, Device::cpu(), AlignedDelete{});
  copy.release();  // owned by the Storage now
  return SafetensorsParser::build(std::move(exact), label);
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) throw InvalidInput("tensor '" + name + "' not found in " + path_);
  return it->second;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  const uint64_t offset = data_start_ + e.begin;
  Shape strides = contiguous_strides(e.shape);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(mapping_->data()) + offset;
  if (addr % element_alignment(e.dtype) == 0)
    return Tensor(mapping_, size_t(offset), e.dtype, e.shape, std::move(strides));
  // Misaligned (legal in the format, never produced by the reference writer): copy once.
  const size_t nbytes = size_t(e.end - e.begin);
  auto copy = Storage::host(std::max<size_t>(nbytes, 1));
  std::memcpy(copy->data(), static_cast<const char*>(mapping_->data()) + offset, nbytes);
  return Tensor(std::move(copy), 0, e.dtype, e.shape, std::move(strides));
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Largest elements first (then by name), like the reference writer: with a header padded to a
  // multiple of 8, every tensor then starts aligned to its element size.
  std::vector<std::pair<std::string, Tensor>> order;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") throw InvalidInput(path + ": '__metadata__' cannot name a tensor");
    if (!t.defined()) throw InvalidInput(path + ": tensor '" + name + "' is undefined");
    if (!t.device().host_accessible())
      throw InvalidInput(path + ": tensor '" + name + "' is on " + t.device().str() +
                         "; copy it to the host before saving");
    order.emplace_back(name, t.is_contiguous() ? t : t.contiguous());
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return dtype_size(a.second.dtype()) > dtype_size(b.second.dtype());
  });

  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : order) {
    const uint64_t n = t.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // JSON allows trailing spaces

  // OutputFile: a regular target is replaced only once the whole file is written (a temporary
  // file renamed into place); devices and FIFOs are written through (io/output_file.hpp).
  io::OutputFile out(path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (const auto& [name, t] : order) out.write(t.raw(), t.nbytes());
  out.commit();
}

}  // namespace moex
