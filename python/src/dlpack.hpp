// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), the unversioned form that every
// producer (torch, numpy, cupy, jax) still exports through `__dlpack__()`. Only the structs and
// codes moex reads, written from the public specification. A producer hands a PyCapsule named
// "dltensor" holding a DLManagedTensor*; the consumer renames the capsule "used_dltensor" and from
// then on owns the tensor: it calls `deleter` once when it no longer needs the memory.
#pragma once

#include <cstdint>

namespace moex::python::dlpack {

enum DeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,     // pinned host memory: host-addressable
  kDLCUDAManaged = 13,
};

enum DataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLBool = 6,
};

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null = compact row-major
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

// __dlpack__(stream=...) values with a meaning of their own on CUDA (others are cudaStream_t).
constexpr int64_t kStreamLegacyDefault = 1;
constexpr int64_t kStreamPerThreadDefault = 2;

}  // namespace moex::python::dlpack
