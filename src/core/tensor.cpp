#include "moex/tensor.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/device_hooks.hpp"
#include "moex/error.hpp"

namespace moex {

std::string shape_str(const Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

int64_t shape_numel(const Shape& s) {
  // Shapes come from files and configs: a product that wraps around would turn a huge request
  // into a small (or negative) one that passes every later check.
  int64_t n = 1;
  for (int64_t d : s)
    if (d < 0) throw InvalidInput("negative dimension in shape " + shape_str(s));
  for (int64_t d : s) {
    if (__builtin_mul_overflow(n, d, &n))
      throw InvalidInput("shape " + shape_str(s) + " has more elements than fit in 64 bits");
  }
  return n;
}

// Bytes of a contiguous tensor of `shape`, checked for overflow.
static size_t shape_bytes(const Shape& shape, DType dtype) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(size_t(shape_numel(shape)), dtype_size(dtype), &bytes))
    throw InvalidInput("shape " + shape_str(shape) + " of " + std::string(dtype_name(dtype)) +
                       " has more bytes than fit in 64 bits");
  return bytes;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    if (__builtin_mul_overflow(acc, std::max<int64_t>(shape[i], 1), &acc))
      throw InvalidInput("shape " + shape_str(shape) + " has strides that overflow 64 bits");
  }
  return st;
}

Storage::Storage(void* data, size_t bytes, Device device, std::function<void(void*)> release)
    : data_(data), bytes_(bytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (release_) release_(data_);
}

std::shared_ptr<Storage> Storage::host(size_t bytes, bool zero, Device dev) {
  size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = bytes > SIZE_MAX - 64 ? nullptr : std::aligned_alloc(64, rounded);
  if (!p) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes (" +
                      std::to_string(bytes / 1000000000) + " GB)");
  if (zero) std::memset(p, 0, rounded);
  return std::make_shared<Storage>(p, bytes, dev, [](void* q) { std::free(q); });
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t byte_offset, DType dtype, Shape shape,
               Shape strides)
    : storage_(std::move(storage)), offset_(byte_offset), dtype_(dtype),
      shape_(std::move(shape)), strides_(std::move(strides)) {}

static std::shared_ptr<Storage> alloc_on(size_t bytes, Device device, bool zero) {
  if (device.host_accessible()) return Storage::host(bytes, zero, device);
  auto s = detail::device_alloc(bytes, device);
  if (zero && bytes) {
    auto h = Storage::host(bytes, true);
    detail::device_copy(s->data(), device, h->data(), Device::cpu(), bytes);
  }
  return s;
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  const size_t bytes = shape_bytes(shape, dtype);
  Shape st = contiguous_strides(shape);
  return Tensor(alloc_on(bytes, device, false), 0, dtype, std::move(shape), std::move(st));
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  const size_t bytes = shape_bytes(shape, dtype);
  Shape st = contiguous_strides(shape);
  return Tensor(alloc_on(bytes, device, true), 0, dtype, std::move(shape), std::move(st));
}

Tensor Tensor::from_floats(const std::vector<float>& v, Shape shape, DType dtype) {
  if (int64_t(v.size()) != shape_numel(shape))
    throw InvalidInput("from_floats: " + std::to_string(v.size()) + " values for shape " +
                       shape_str(shape));
  Tensor t = empty(std::move(shape), dtype);
  convert_floats(v.data(), DType::kF32, t.raw(), dtype, int64_t(v.size()));
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& v, Shape shape, DType dtype) {
  if (int64_t(v.size()) != shape_numel(shape))
    throw InvalidInput("from_ints: " + std::to_string(v.size()) + " values for shape " +
                       shape_str(shape));
  Tensor t = empty(std::move(shape), dtype);
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype) {
      case DType::kI64: t.data<int64_t>()[i] = v[i]; break;
      case DType::kI32:
        if (v[i] < INT32_MIN || v[i] > INT32_MAX)
          throw InvalidInput("from_ints: value " + std::to_string(v[i]) + " at " + std::to_string(i) +
                             " does not fit int32");
        t.data<int32_t>()[i] = int32_t(v[i]);
        break;
      default: throw InvalidInput("from_ints: dtype " + std::string(dtype_name(dtype)));
    }
  }
  return t;
}

Tensor Tensor::from_blob(void* data, DType dtype, Shape shape, Shape strides, Device device,
                         std::function<void()> release) {
  if (strides.size() != shape.size())
    throw InvalidInput("from_blob: " + std::to_string(strides.size()) + " strides for shape " +
                       shape_str(shape));
  // The storage covers the elements the view can reach: 1 + sum (size - 1) * stride.
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0)
      throw InvalidInput("from_blob: negative size or stride in shape " + shape_str(shape) +
                         ", strides " + shape_str(strides));
    if (shape[i] == 0) extent = 0;
    if (extent) extent += (shape[i] - 1) * strides[i];
  }
  if (extent && !data) throw InvalidInput("from_blob: null data for shape " + shape_str(shape));
  std::function<void(void*)> on_free;
  if (release) on_free = [r = std::move(release)](void*) { r(); };
  auto storage = std::make_shared<Storage>(data, size_t(extent) * dtype_size(dtype), device,
                                           std::move(on_free));
  return Tensor(std::move(storage), 0, dtype, std::move(shape), std::move(strides));
}

size_t Tensor::nbytes() const { return size_t(numel()) * dtype_size(dtype_); }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to be out of place (views of empty slices keep odd strides)
  int64_t expect = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expect) return false;
    expect *= shape_[i];
  }
  return true;
}

static int64_t norm_dim(int64_t d, int64_t n) {
  int64_t r = d < 0 ? d + n : d;
  if (r < 0 || r >= n) throw InvalidInput("dimension " + std::to_string(d) + " out of range");
  return r;
}

Tensor Tensor::select(int64_t d, int64_t i) const {
  d = norm_dim(d, dim());
  if (i < 0 || i >= shape_[size_t(d)]) throw InvalidInput("select index out of range");
  Shape sh = shape_, st = strides_;
  size_t off = offset_ + size_t(i * strides_[size_t(d)]) * dtype_size(dtype_);
  sh.erase(sh.begin() + d);
  st.erase(st.begin() + d);
  return Tensor(storage_, off, dtype_, sh, st);
}

Tensor Tensor::slice(int64_t d, int64_t b, int64_t e) const {
  d = norm_dim(d, dim());
  if (b < 0 || e < b || e > shape_[size_t(d)]) throw InvalidInput("slice out of range");
  Shape sh = shape_;
  sh[size_t(d)] = e - b;
  size_t off = offset_ + size_t(b * strides_[size_t(d)]) * dtype_size(dtype_);
  return Tensor(storage_, off, dtype_, sh, strides_);
}

Tensor Tensor::view(Shape shape) const {
  if (!is_contiguous()) throw InvalidInput("view of a non-contiguous tensor");
  if (shape_numel(shape) != numel())
    throw InvalidInput("view " + shape_str(shape) + " of " + shape_str(shape_));
  Shape st = contiguous_strides(shape);
  return Tensor(storage_, offset_, dtype_, std::move(shape), std::move(st));
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  a = norm_dim(a, dim());
  b = norm_dim(b, dim());
  Shape sh = shape_, st = strides_;
  std::swap(sh[size_t(a)], sh[size_t(b)]);
  std::swap(st[size_t(a)], st[size_t(b)]);
  return Tensor(storage_, offset_, dtype_, sh, st);
}

// Copies a strided host tensor into contiguous memory, element by element (any dtype).
static void gather_contiguous(const Tensor& src, void* dst) {
  size_t es = dtype_size(src.dtype());
  int64_t n = src.numel(), nd = src.dim();
  std::vector<int64_t> idx(size_t(nd), 0);
  const char* base = static_cast<const char*>(src.raw());
  char* out = static_cast<char*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int64_t d = 0; d < nd; ++d) off += idx[size_t(d)] * src.stride(d);
    std::memcpy(out + size_t(i) * es, base + off * int64_t(es), es);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < src.size(d)) break;
      idx[size_t(d)] = 0;
    }
  }
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  if (!device().host_accessible())
    throw Unsupported("contiguous() of a strided device tensor: " + str());
  Tensor t = empty(shape_, dtype_, device());
  gather_contiguous(*this, t.raw());
  return t;
}

Tensor Tensor::clone() const {
  Tensor c = contiguous();
  Tensor t = empty(shape_, dtype_, device());
  if (nbytes() == 0) return t;
  if (device().host_accessible()) std::memcpy(t.raw(), c.raw(), nbytes());
  else detail::device_copy(t.raw(), device(), c.raw(), device(), nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  if (!device().host_accessible()) throw Unsupported("dtype conversion on device: " + str());
  Tensor c = contiguous();
  Tensor t = empty(shape_, dtype, device());
  convert_floats(c.raw(), dtype_, t.raw(), dtype, numel());
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor c = contiguous();
  if (device.host_accessible() && c.device().host_accessible()) {
    Tensor t = empty(shape_, dtype_, device);
    if (nbytes()) std::memcpy(t.raw(), c.raw(), nbytes());
    return t;
  }
  Tensor t = empty(shape_, dtype_, device);
  if (nbytes()) detail::device_copy(t.raw(), device, c.raw(), c.device(), nbytes());
  if (device.is_cuda()) c.release_file_pages();
  return t;
}

void Tensor::release_file_pages() const {
  if (!storage_ || !storage_->file_mapped() || nbytes() == 0) return;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(raw()) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(raw()) + nbytes()) / page * page;
  // MADV_DONTNEED on an unmodified private file mapping only drops the process's pages; the
  // mapping stays valid and refaults from the page cache or the file.
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

bool Tensor::collapse_to_huge_pages() const {
  if (!storage_ || storage_->file_mapped() || !device().is_cpu() || nbytes() == 0 || !is_contiguous())
    return false;
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(raw()) + kHuge - 1) / kHuge * kHuge;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(raw()) + nbytes()) / kHuge * kHuge;
  if (end <= begin) return false;
#ifdef MADV_HUGEPAGE
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // later faults too
#endif
  // MADV_COLLAPSE is 25 in the Linux UAPI; older headers lack the name, older kernels answer
  // EINVAL (ignored: a hint).
  constexpr int kMadvCollapse = 25;
  return ::madvise(reinterpret_cast<void*>(begin), end - begin, kMadvCollapse) == 0;
}

static double load_as_double(const void* p, DType t) {
  switch (t) {
    case DType::kF32: return *static_cast<const float*>(p);
    case DType::kF64: return *static_cast<const double*>(p);
    case DType::kBF16: return bf16_to_float(*static_cast<const uint16_t*>(p));
    case DType::kF16: return f16_to_float(*static_cast<const uint16_t*>(p));
    case DType::kF8E4M3: return f8e4m3_to_float(*static_cast<const uint8_t*>(p));
    case DType::kF8E8M0: return e8m0_to_float(*static_cast<const uint8_t*>(p));
    case DType::kI8: return *static_cast<const int8_t*>(p);
    case DType::kU8: case DType::kBool: case DType::kFP4x2: return *static_cast<const uint8_t*>(p);
    case DType::kI16: return *static_cast<const int16_t*>(p);
    case DType::kI32: return *static_cast<const int32_t*>(p);
    case DType::kI64: return double(*static_cast<const int64_t*>(p));
  }
  return 0;
}

double Tensor::item_double(std::initializer_list<int64_t> idx) const {
  if (int64_t(idx.size()) != dim()) throw InvalidInput("item_double: wrong index rank");
  Tensor h = device().host_accessible() ? *this : to(Device::cpu());
  int64_t off = 0, d = 0;
  for (int64_t i : idx) {
    if (i < 0 || i >= h.size(d)) throw InvalidInput("item_double: index out of range");
    off += i * h.stride(d++);
  }
  return load_as_double(static_cast<const char*>(h.raw()) + off * int64_t(dtype_size(dtype_)), dtype_);
}

std::vector<float> Tensor::to_float_vector() const {
  Tensor h = (device().host_accessible() ? *this : to(Device::cpu())).contiguous();
  std::vector<float> v(static_cast<size_t>(numel()));
  const char* p = static_cast<const char*>(h.raw());
  size_t es = dtype_size(dtype_);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(load_as_double(p + i * es, dtype_));
  return v;
}

std::vector<int64_t> Tensor::to_int_vector() const {
  Tensor h = (device().host_accessible() ? *this : to(Device::cpu())).contiguous();
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype_) {
      case DType::kI64: v[i] = h.data<int64_t>()[i]; break;
      case DType::kI32: v[i] = h.data<int32_t>()[i]; break;
      case DType::kI16: v[i] = h.data<int16_t>()[i]; break;
      case DType::kI8: v[i] = h.data<int8_t>()[i]; break;
      case DType::kU8: case DType::kBool: v[i] = h.data<uint8_t>()[i]; break;
      default: throw InvalidInput("to_int_vector of a " + std::string(dtype_name(dtype_)) + " tensor");
    }
  }
  return v;
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " on " + device().str();
}

void convert_floats(const void* src, DType st, void* dst, DType dt, int64_t n) {
  if (n <= 0) return;  // empty tensors may have null data pointers
  if (st == dt) {
    std::memcpy(dst, src, size_t(n) * dtype_size(st));
    return;
  }
  auto bad = [&] {
    throw Unsupported("no conversion " + std::string(dtype_name(st)) + " -> " +
                      std::string(dtype_name(dt)));
  };
  if (!is_floating(st) || !is_floating(dt) || st == DType::kFP4x2 || dt == DType::kFP4x2) bad();
  const char* s = static_cast<const char*>(src);
  size_t ses = dtype_size(st);
  for (int64_t i = 0; i < n; ++i) {
    double v = load_as_double(s + size_t(i) * ses, st);
    float f = float(v);
    switch (dt) {
      case DType::kF32: static_cast<float*>(dst)[i] = f; break;
      case DType::kF64: static_cast<double*>(dst)[i] = v; break;
      case DType::kBF16: static_cast<uint16_t*>(dst)[i] = float_to_bf16(f); break;
      case DType::kF16: static_cast<uint16_t*>(dst)[i] = float_to_f16(f); break;
      case DType::kF8E4M3: static_cast<uint8_t*>(dst)[i] = float_to_f8e4m3(f); break;
      case DType::kF8E8M0: static_cast<uint8_t*>(dst)[i] = float_to_e8m0_ceil(f); break;
      default: bad();
    }
  }
}

}  // namespace moex
