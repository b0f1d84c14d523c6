// The library reports errors by throwing; it never exits or aborts. The CLI turns these into one
// line on stderr and a non-zero exit code. Each subclass names a category the CLI and tests can
// tell apart; the message always names the offending thing (tensor, file, key, backend, id).
#pragma once

#include <stdexcept>
#include <string>

namespace moex {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Malformed input data: safetensors header, config.json, tensor shapes, token ids.
class InvalidInput : public Error {
 public:
  using Error::Error;
};

// A valid request that this build, backend or device cannot serve (unsupported dtype, layout,
// missing GPU, unmet hardware requirement).
class Unsupported : public Error {
 public:
  using Error::Error;
};

// A name that is not registered: backend, architecture, sub-config.
class UnknownName : public Error {
 public:
  using Error::Error;
};

// Errors reported by the CUDA runtime, cuBLAS, NCCL.
class DeviceError : public Error {
 public:
  using Error::Error;
};

}  // namespace moex
