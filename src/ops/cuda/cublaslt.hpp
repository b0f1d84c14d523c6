// The cuBLASLt handle and workspace of a device, shared by the GEMM ops (linear.cu,
// linear_per_group.cu): one handle and one workspace per device for the process's lifetime.
#pragma once

#include <cublasLt.h>

#include <cstddef>

#include "moex/dtype.hpp"

namespace moex::ops::cuda {

inline constexpr size_t kCublasLtWorkspaceBytes = size_t(32) << 20;

struct CublasLt {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // kCublasLtWorkspaceBytes
};
// Created on first use (thread-safe). Defined in linear.cu.
CublasLt& cublaslt(int device);

// The cuBLASLt data type of a float dtype; Unsupported for others ("<op> on CUDA: dtype ...").
cudaDataType_t cublas_dtype(DType t, const char* op);

}  // namespace moex::ops::cuda
