// Tensors' dtypes and fingerprints, on the CPU or the GPU.
#include "culprit/tensors.h"

#include <ATen/autocast_mode.h>
#include <dlfcn.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/torch.h>

#include "culprit/finite.h"
#include "culprit/math_libraries.h"

#ifdef CULPRIT_HAVE_CUDA
#include "culprit/fingerprint_cuda.h"
#endif

namespace culprit::harness {

// Deterministic settings; returns the BLAS thread count set (0: no thread control found).
int setup_determinism(int threads) {
  pin_math_libraries();  // before MKL's first computation, where that is still to come
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicMkldnn(true);
  at::set_num_threads(threads);
  static bool interop_set = false;
  if (!interop_set) {
    at::set_num_interop_threads(1);
    interop_set = true;
  }
  // The graph executor would re-optimise TorchScript graphs after a few profiling runs, and how
  // many runs a rank makes depends on the world size: keep it off.
  torch::jit::setGraphExecutorOptimize(false);
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
    return threads;
  }
  // MKL (linked into libtorch): at::set_num_threads sets its thread count too.
  return at::hasMKL() ? threads : 0;
}

AutocastScope::AutocastScope(Precision p, const at::Device& device)
    : on_(p == Precision::kBf16), cuda_(device.is_cuda()) {
  if (!on_) return;
  const auto type = cuda_ ? at::kCUDA : at::kCPU;
  prev_cache_ = at::autocast::is_autocast_cache_enabled();
  prev_enabled_ = at::autocast::is_autocast_enabled(type);
  prev_dtype_ = at::autocast::get_autocast_dtype(type);
  at::autocast::set_autocast_enabled(type, true);
  at::autocast::set_autocast_dtype(type, at::kBFloat16);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(true);
}

AutocastScope::~AutocastScope() {
  if (!on_) return;
  const auto type = cuda_ ? at::kCUDA : at::kCPU;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(type, prev_enabled_);
  at::autocast::set_autocast_dtype(type, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_);
}

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kLong: return DType::kInt64;
    case at::kInt: return DType::kInt32;
    case at::kByte: return DType::kUInt8;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    case at::kBool: return DType::kBool;
    default: throw std::runtime_error("unsupported dtype " + std::string(c10::toString(t)));
  }
}

at::ScalarType to_scalar(DType t) {
  switch (t) {
    case DType::kFloat64: return at::kDouble;
    case DType::kInt64: return at::kLong;
    case DType::kInt32: return at::kInt;
    case DType::kUInt8: return at::kByte;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kFloat16: return at::kHalf;
    case DType::kBool: return at::kBool;
    default: return at::kFloat;
  }
}

Fingerprint tensor_fingerprint(const at::Tensor& t) {
  auto c = t.contiguous();
  const std::size_t n = c.numel() * c.element_size();
  if (c.is_cuda()) {
#ifdef CULPRIT_HAVE_CUDA
    // On the GPU: only the chunk hashes come back (culprit/fingerprint_cuda.h).
    Fingerprint f = 0;
    if (cuda::fingerprint_on(c.get_device(), c.data_ptr(), n, &f).ok()) return f;
#endif
    c = c.cpu();  // the same bytes, the same fingerprint
  }
  return fingerprint_bytes(c.data_ptr(), n);
}

// The tensor's fingerprint; *finite &= whether its elements are (one pass for float32 on the CPU).
static Fingerprint fingerprint_and_scan(const at::Tensor& t, bool* finite) {
  if (t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()) {
    bool ok = true;
    const Fingerprint f = fingerprint_finite(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()), &ok);
    *finite = *finite && ok;
    return f;
  }
  if (at::isFloatingType(t.scalar_type()) && *finite) *finite = torch::isfinite(t).all().item<bool>();
  return tensor_fingerprint(t);
}

Fingerprint set_fingerprint(const std::vector<NamedTensor>& tensors, std::vector<Fingerprint>* each, bool* finite) {
  FingerprintSet set;
  if (each) each->clear();
  for (const auto& nt : tensors) {
    auto sizes = nt.tensor.sizes();
    const Fingerprint f = finite ? fingerprint_and_scan(nt.tensor, finite) : tensor_fingerprint(nt.tensor);
    if (each) each->push_back(f);
    set.add(nt.name, to_dtype(nt.tensor.scalar_type()), std::vector<std::int64_t>(sizes.begin(), sizes.end()), f);
  }
  return set.finish();
}

}  // namespace culprit::harness
