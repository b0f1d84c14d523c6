// See quantized_weights.hpp.
#include "model/quantized_weights.hpp"

#include <cstring>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/strict_json.hpp"
#include "moex/error.hpp"
#include "moex/quant.hpp"

namespace moex::model {
namespace {

const char* kScaleSuffix = ".weight_scale_inv";

std::string json_str(const nlohmann::json& v) {
  return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 80);
}

// A string key of quantization_config; `dflt` when absent or null.
std::string quant_key(const nlohmann::json& qc, const char* key, const char* dflt, const std::string& where) {
  const auto it = qc.find(key);
  if (it == qc.end() || it->is_null()) return dflt;
  if (!it->is_string())
    throw InvalidInput(where + ": key 'quantization_config." + key + "' must be a string, got " +
                       io::json_type_name(*it));
  return it->get<std::string>();
}

}  // namespace

bool is_quantized_weight(const Checkpoint& ckpt, const std::string& name) {
  return ckpt.has(name + kScaleSuffix);
}

QuantLoad parse_quant_load(const Checkpoint& ckpt, bool dequantize) {
  QuantLoad q;
  q.dequantize = dequantize;
  q.where = ckpt.dir() + "/config.json";
  const nlohmann::json& cfg = ckpt.config();
  const auto it = cfg.find("quantization_config");
  if (it == cfg.end() || it->is_null()) {
    for (const auto& name : ckpt.names())
      if (name.size() > std::strlen(kScaleSuffix) &&
          name.compare(name.size() - std::strlen(kScaleSuffix), std::string::npos, kScaleSuffix) == 0)
        throw InvalidInput("tensor '" + name + "' in " + ckpt.file_of(name) +
                           " is a block scale, but " + q.where +
                           " has no quantization_config (expected {\"quant_method\": \"fp8\", ...})");
    return q;
  }
  const nlohmann::json& qc = *it;
  if (!qc.is_object())
    throw InvalidInput(q.where + ": key 'quantization_config' must be an object, got " + io::json_type_name(qc));
  q.quantized = true;
  const std::string method = quant_key(qc, "quant_method", "", q.where);
  if (method != "fp8")
    throw Unsupported(q.where + ": quantization_config.quant_method '" + method +
                      "' is not supported (supported: fp8, block-scaled e4m3 weights)");
  const std::string fmt = quant_key(qc, "fmt", "e4m3", q.where);
  if (fmt != "e4m3")
    throw Unsupported(q.where + ": quantization_config.fmt '" + fmt + "' is not supported (supported: e4m3)");
  q.scale_fmt = quant_key(qc, "scale_fmt", "float", q.where);
  if (q.scale_fmt != "float" && q.scale_fmt != "ue8m0")
    throw Unsupported(q.where + ": quantization_config.scale_fmt '" + q.scale_fmt +
                      "' is not supported (supported: float, ue8m0)");
  const auto bs = qc.find("weight_block_size");
  if (bs == qc.end() || bs->is_null())
    throw InvalidInput(q.where + ": quantization_config.weight_block_size is missing (expected [128, 128])");
  const bool is_128 = bs->is_array() && bs->size() == 2 && (*bs)[0].is_number_integer() &&
                      (*bs)[1].is_number_integer() && (*bs)[0].get<int64_t>() == quant::kFp8Block &&
                      (*bs)[1].get<int64_t>() == quant::kFp8Block;
  if (!is_128)
    throw Unsupported(q.where + ": quantization_config.weight_block_size " + json_str(*bs) +
                      " is not supported (FP8 weights: [128, 128])");
  const std::string scheme = quant_key(qc, "activation_scheme", "dynamic", q.where);
  if (scheme == "static") {
    bool has_scales = false;
    for (const auto& name : ckpt.names())
      if (name.find("activation_scale") != std::string::npos || name.find("input_scale") != std::string::npos)
        has_scales = true;
    if (!has_scales)
      throw InvalidInput(q.where + ": quantization_config.activation_scheme is 'static' but " + ckpt.dir() +
                         " holds no activation scales ('<linear>.activation_scale' / 'input_scale')");
    throw Unsupported(q.where + ": quantization_config.activation_scheme 'static' is not supported "
                      "(supported: dynamic)");
  }
  if (scheme != "dynamic")
    throw Unsupported(q.where + ": quantization_config.activation_scheme '" + scheme +
                      "' is not supported (supported: dynamic)");
  const auto ed = cfg.find("expert_dtype");
  if (ed != cfg.end() && !ed->is_null()) {
    if (!ed->is_string() || (*ed != "fp4" && *ed != "fp8"))
      throw Unsupported(q.where + ": expert_dtype " + json_str(*ed) + " is not supported (fp8, fp4)");
    q.fp4_experts = *ed == "fp4";
  }
  return q;
}

QuantizedTensor read_quantized(const Checkpoint& ckpt, const std::string& name, int64_t n, int64_t k, bool fp4) {
  const std::string wname = name + ".weight", sname = name + kScaleSuffix;
  if (!ckpt.has(sname)) {
    // Reached for weights stored in a quantized dtype: a missing scale is the error.
    throw InvalidInput("tensor '" + wname + "' in " + ckpt.file_of(wname) + " is " +
                       std::string(dtype_name(ckpt.get(wname).dtype())) + " but its scale '" + sname +
                       "' is missing");
  }
  QuantizedTensor q;
  q.n = n;
  q.k = k;
  const Tensor w = ckpt.get(wname);
  const Tensor s = ckpt.get(sname);
  auto bad = [&](const std::string& tensor, const std::string& what, const std::string& expected,
                 const std::string& got) {
    return InvalidInput("tensor '" + tensor + "' in " + ckpt.file_of(tensor) + " has " + what + " " + got +
                        ", expected " + expected);
  };
  Shape sshape;
  if (fp4) {
    if (k % 2 != 0)
      throw InvalidInput("tensor '" + wname + "' in " + ckpt.file_of(wname) + ": FP4 weights pack two values "
                         "per byte along K, but K = " + std::to_string(k) + " is odd");
    if (w.dtype() != DType::kI8 && w.dtype() != DType::kU8)
      throw bad(wname, "dtype", "int8 (two e2m1 codes per byte)", std::string(dtype_name(w.dtype())));
    if (w.shape() != Shape{n, k / 2}) throw bad(wname, "shape", shape_str({n, k / 2}), shape_str(w.shape()));
    sshape = {n, quant::ceil_div(k, quant::kFp4BlockK)};
    if (s.dtype() != DType::kF8E8M0)
      throw bad(sname, "dtype", "float8_e8m0fnu (FP4 scales)", std::string(dtype_name(s.dtype())));
    q.scheme.kind = QuantScheme::Kind::kFp4E2M1;
    q.scheme.block_n = 1;
    q.scheme.block_k = quant::kFp4BlockK;
  } else {
    if (w.dtype() != DType::kF8E4M3)
      throw bad(wname, "dtype", "float8_e4m3fn (it has a weight_scale_inv)", std::string(dtype_name(w.dtype())));
    if (w.shape() != Shape{n, k}) throw bad(wname, "shape", shape_str({n, k}), shape_str(w.shape()));
    sshape = {quant::ceil_div(n, quant::kFp8Block), quant::ceil_div(k, quant::kFp8Block)};
    if (s.dtype() != DType::kF32 && s.dtype() != DType::kF8E8M0)
      throw bad(sname, "dtype", "float32 or float8_e8m0fnu", std::string(dtype_name(s.dtype())));
    q.scheme.kind = QuantScheme::Kind::kFp8E4M3;
    q.scheme.block_n = quant::kFp8Block;
    q.scheme.block_k = quant::kFp8Block;
  }
  if (s.shape() != sshape)
    throw bad(sname, "shape", shape_str(sshape) + " (blocks of " + shape_str({q.scheme.block_n, q.scheme.block_k}) +
                                  " over " + shape_str({n, k}) + ")",
              shape_str(s.shape()));
  q.scheme.scale_dtype = s.dtype();
  // The checked reads (load progress counts them); FP4 codes stay int8.
  q.codes = ckpt.get(wname, w.shape(), w.dtype() == DType::kU8 ? DType::kU8 : w.dtype());
  q.scale = ckpt.get(sname, sshape, s.dtype());
  return q;
}

Tensor dequantize(const QuantizedTensor& q, DType dtype) {
  Tensor out = Tensor::empty({q.n, q.k}, DType::kF32);
  float* o = out.data<float>();
  const Tensor codes = q.codes.contiguous(), scale = q.scale.contiguous();
  const uint8_t* c = static_cast<const uint8_t*>(codes.raw());
  const void* s = scale.raw();
  const DType sdt = scale.dtype();
  const bool fp4 = q.scheme.kind == QuantScheme::Kind::kFp4E2M1;
  const int64_t bn = q.scheme.block_n, bk = q.scheme.block_k, scols = quant::ceil_div(q.k, bk);
#pragma omp parallel for schedule(static) if (q.n * q.k >= (1 << 16))
  for (int64_t n = 0; n < q.n; ++n)
    for (int64_t k = 0; k < q.k; ++k) {
      const float v = fp4 ? fp4_e2m1_to_float(uint8_t(c[n * (q.k / 2) + k / 2] >> (4 * (k & 1))))
                          : f8e4m3_to_float(c[n * q.k + k]);
      o[n * q.k + k] = v * quant::scale_value(s, sdt, (n / bn) * scols + k / bk);
    }
  return dtype == DType::kF32 ? out : out.to(dtype);
}

namespace {
// FP4 linears outside the experts are not a hub format: a weight's dtype says which it is.
bool stored_fp4(const Checkpoint& ckpt, const std::string& name) {
  const std::string wname = name + ".weight";
  return ckpt.has(wname) && ckpt.get(wname).dtype() == DType::kI8;
}
}  // namespace

Tensor read_dequantized(const Checkpoint& ckpt, const std::string& name, int64_t n, int64_t k, DType dtype) {
  return dequantize(read_quantized(ckpt, name, n, k, stored_fp4(ckpt, name)), dtype);
}

namespace {

// Rows or columns [b, e) of a host [n, k] tensor (a view for rows of a contiguous tensor).
Tensor cut(const Tensor& t, TpSplit::Dim dim, int64_t b, int64_t e) {
  return t.slice(dim == TpSplit::Dim::kOut ? 0 : 1, b, e).contiguous();
}

}  // namespace

ops::LinearWeight load_linear_weight(const Checkpoint& ckpt, const std::string& name, int64_t out, int64_t in,
                                     DType dtype, Device device, bool keep_tensor, const QuantLoad& quant,
                                     const TpSplit& tp) {
  const std::string wname = name + ".weight";
  const bool scaled = is_quantized_weight(ckpt, name);
  const bool split = tp.active();
  // (Plain variables, not a structured binding: the lambda below captures them.)
  int64_t b = 0, e = 0;
  if (split) std::tie(b, e) = tp.range(tp.dim == TpSplit::Dim::kOut ? out : in, "'" + wname + "'");
  auto share = [&](const Tensor& t) { return split ? cut(t, tp.dim, b, e) : t; };
  if (!scaled) {
    // A weight in a quantized dtype without its scale would be read as bare codes.
    if (ckpt.has(wname) && ckpt.get(wname).dtype() == DType::kF8E4M3) read_quantized(ckpt, name, out, in, false);
    return ops::prepare_linear(share(ckpt.get(wname, {out, in}, dtype)).to(device), keep_tensor);
  }
  if (!quant.quantized)
    throw InvalidInput("tensor '" + name + kScaleSuffix + "' in " + ckpt.file_of(name + kScaleSuffix) +
                       " is a block scale, but " + ckpt.dir() + "/config.json has no quantization_config");
  if (quant.dequantize) return ops::prepare_linear(share(read_dequantized(ckpt, name, out, in, dtype)).to(device), keep_tensor);
  QuantizedTensor q = read_quantized(ckpt, name, out, in, stored_fp4(ckpt, name));
  if (!split) return ops::prepare_quantized_linear(q.codes.to(device), q.scale.to(device), q.scheme, out, in);
  // The share keeps whole scale blocks: its bounds on multiples of the block (the last one may
  // end with the weight).
  const bool rows = tp.dim == TpSplit::Dim::kOut;
  const int64_t block = rows ? q.scheme.block_n : q.scheme.block_k, size = rows ? out : in;
  if (b % block != 0 || (e % block != 0 && e != size))
    throw InvalidInput("tensor parallelism: '" + wname + "' would be cut at " + (rows ? "row " : "column ") +
                       std::to_string(b % block ? b : e) + ", inside a " + std::to_string(block) +
                       "-wide block of its weight_scale_inv (--tp-size " + std::to_string(tp.parts) +
                       "); load with --dequantize or choose another --tp-size");
  const bool fp4 = q.scheme.kind == QuantScheme::Kind::kFp4E2M1;
  const int64_t cb = !rows && fp4 ? b / 2 : b, ce = !rows && fp4 ? e / 2 : e;  // FP4: two codes per byte along K
  Tensor codes = cut(q.codes, tp.dim, cb, ce);
  Tensor scale = cut(q.scale, tp.dim, b / block, quant::ceil_div(e, block));
  return ops::prepare_quantized_linear(codes.to(device), scale.to(device), q.scheme, rows ? e - b : out,
                                       rows ? in : e - b);
}

}  // namespace moex::model
