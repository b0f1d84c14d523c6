// A minimal, device-aware tensor: shared storage + dtype + shape + strides (in elements).
//
// Storage is reference counted and may be owned memory, a read-only memory-mapped file region
// (checkpoint weights are never copied unless a conversion is needed), or device memory from the
// CUDA caching allocator. Views share storage. The library only needs what the experts and the
// models use, so this is deliberately not a general array library.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "moex/device.hpp"
#include "moex/dtype.hpp"

namespace moex {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Storage {
 public:
  // Takes ownership through `release`, called once with `data` when the last reference drops.
  Storage(void* data, size_t bytes, Device device, std::function<void(void*)> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // A read-only mapping of a file (checkpoint weights): its resident pages may be dropped and are
  // read back from the file when touched again.
  bool file_mapped() const { return file_mapped_; }
  void mark_file_mapped() { file_mapped_ = true; }

  // 64-byte aligned host memory (zero-filled only when asked: callers overwrite it anyway).
  static std::shared_ptr<Storage> host(size_t bytes, bool zero = false, Device dev = Device::cpu());

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  bool file_mapped_ = false;
  std::function<void(void*)> release_;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, DType dtype, Shape shape,
         Shape strides);

  // Allocates a contiguous tensor (uninitialised unless zero) on a host-accessible device;
  // CUDA tensors come from moex::cuda::empty (the caching allocator).
  static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::cpu());
  // Copies host values, converting float -> dtype (rounding to nearest even).
  static Tensor from_floats(const std::vector<float>& v, Shape shape, DType dtype = DType::kF32);
  static Tensor from_ints(const std::vector<int64_t>& v, Shape shape, DType dtype = DType::kI64);
  // Wraps memory that moex does not own (another library's array: numpy, torch, DLPack) without
  // copying. `data` is the address of element [0, ..., 0]; `strides` are in elements (>= 0: a
  // reversed view is rejected, copy it first). `release` runs once when the last tensor viewing
  // the memory is gone (drop the owner's reference there); empty = the caller keeps the memory
  // alive longer than every view of it. The library never frees `data` itself.
  // Throws InvalidInput for a rank mismatch, negative sizes or strides, or a null `data` that
  // should hold elements.
  static Tensor from_blob(void* data, DType dtype, Shape shape, Shape strides, Device device,
                          std::function<void()> release = {});

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const { return shape_.at(size_t(d < 0 ? d + dim() : d)); }
  int64_t stride(int64_t d) const { return strides_.at(size_t(d < 0 ? d + dim() : d)); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const;
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <class T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Views (share storage).
  Tensor select(int64_t d, int64_t i) const;          // drops dimension d
  Tensor slice(int64_t d, int64_t begin, int64_t end) const;
  Tensor view(Shape shape) const;                     // contiguous tensors only
  Tensor transpose(int64_t a, int64_t b) const;

  // Copies.
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;      // host-accessible tensors; float <-> float conversions
  // host <-> CUDA (CUDA builds). A file-mapped host tensor copied to a device releases its pages
  // (release_file_pages), so that loading a checkpoint onto a GPU does not leave it resident.
  Tensor to(Device device) const;
  // For a view of a file mapping: lets the OS drop the resident pages wholly inside it (they are
  // read back from the file if touched again), so a loaded model's host memory does not grow
  // with the checkpoint. No-op for other tensors.
  void release_file_pages() const;
  // For host memory other than a file mapping: asks the OS to back the 2 MiB pages
  // wholly inside it with transparent huge pages, now and in place (MADV_COLLAPSE, Linux 6.1+;
  // the contents stay). Streaming a weight matrix then walks the page tables once per 2 MiB
  // instead of once per 4 KiB. A hint: where the kernel or its settings refuse, nothing changes.
  // Costs a copy of the memory inside the kernel (on a VM, whatever the host takes to back new
  // huge pages). Returns whether the kernel did it (false: refused, or no whole 2 MiB page
  // inside; no-op for file mappings and device tensors).
  bool collapse_to_huge_pages() const;

  // Host-side element access for tests, references and small ops (any float dtype -> double).
  double item_double(std::initializer_list<int64_t> idx) const;
  std::vector<float> to_float_vector() const;      // row-major order
  std::vector<int64_t> to_int_vector() const;      // integer dtypes

  std::string str() const;  // "bfloat16[7, 128] on cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
};

Shape contiguous_strides(const Shape& shape);

// Host-to-host conversion of n contiguous elements from one float dtype to another.
void convert_floats(const void* src, DType src_t, void* dst, DType dst_t, int64_t n);

}  // namespace moex
