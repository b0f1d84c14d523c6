// The cuBLASLt handle and workspaces of a device, shared by the GEMM ops (linear.cu,
// linear_per_group.cu): one handle per device and one workspace per (device, stream) for the
// process's lifetime (two streams' GEMMs in flight at once must not share scratch memory).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "moex/dtype.hpp"

namespace moex::ops::cuda {

inline constexpr size_t kCublasLtWorkspaceBytes = size_t(32) << 20;

struct CublasLt {
  cublasLtHandle_t lt = nullptr;
};
// Created on first use (thread-safe). Defined in linear.cu.
CublasLt& cublaslt(int device);
// kCublasLtWorkspaceBytes of scratch for GEMMs enqueued on `stream` of `device` (thread-safe).
void* cublaslt_workspace(int device, cudaStream_t stream);

// The cuBLASLt data type of a float dtype; Unsupported for others ("<op> on CUDA: dtype ...").
cudaDataType_t cublas_dtype(DType t, const char* op);

}  // namespace moex::ops::cuda
