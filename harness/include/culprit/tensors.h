// libtorch tensors as culprit stores and compares them: dtypes, fingerprints (on the CPU or the
// GPU), deterministic settings, and an exception guard. Included by libtorch translation units only.
#pragma once
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "culprit/fingerprint.h"
#include "culprit/status.h"
#include "culprit/system.h"
#include "culprit/error_line.h"
#include "culprit/model.h"

namespace culprit::harness {

DType to_dtype(at::ScalarType t);
at::ScalarType to_scalar(DType t);
Fingerprint tensor_fingerprint(const at::Tensor& t);
// The set fingerprint of named tensors; *each (optional) gets every tensor's own fingerprint;
// *finite (optional): whether every element was finite (float32 on the CPU scanned while hashed).
Fingerprint set_fingerprint(const std::vector<NamedTensor>& tensors, std::vector<Fingerprint>* each = nullptr,
                            bool* finite = nullptr);
// Deterministic libtorch settings (docs/determinism.md); returns the BLAS thread count set (0: no
// thread control found).
int setup_determinism(int threads);

// Runs f, turning any exception into an error Status of category `code` (what f does wrong when
// it throws: the user's model or data that does not fit is bad input, anything else internal).
// An allocation that failed is said as such, bad input whatever `code`; a process out of file
// descriptors too, an I/O failure (culprit/system.h).
template <class Fn>
Status guarded(StatusCode code, const std::string& what, Fn&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    if (is_out_of_memory(e)) return out_of_memory(what);
    if (std::string fds; out_of_file_descriptors(&fds))  // libtorch says "Unable to open /dev/urandom"
      return Status::IoError(what + ": out of file descriptors (" + fds + "): raise the limit");
    return Status::Error(code, what + ": " + error_line(e.what()));
  }
}

// An exception raised by a user's own code (the Python package's model, loss or data set). In
// setup every rank runs the same code on the same samples, and guarded() + agree() turn it into one
// error; in the middle of a step it may be this rank's alone, raised while the others wait in the
// step's collectives, so it must end the job (the package's entry does) rather than become a Status
// this rank alone agrees on.
class UserCodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// guarded() for a computation with collectives inside (a replayed step): a UserCodeError escapes.
template <class Fn>
Status guarded_step(StatusCode code, const std::string& what, Fn&& f) {
  try {
    return f();
  } catch (const UserCodeError&) {
    throw;
  } catch (const std::exception& e) {
    if (is_out_of_memory(e)) return out_of_memory(what);
    if (std::string fds; out_of_file_descriptors(&fds))  // libtorch says "Unable to open /dev/urandom"
      return Status::IoError(what + ": out of file descriptors (" + fds + "): raise the limit");
    return Status::Error(code, what + ": " + error_line(e.what()));
  }
}

// --precision bf16: the forward pass (model and loss) runs inside this scope, which enters and
// leaves autocast exactly as `torch.autocast(device_type, dtype=torch.bfloat16)` does (its cast
// cache on, cleared when the outermost scope ends), so PyTorch eager gets the same casts and bits.
// fp32: does nothing.
class AutocastScope {
 public:
  AutocastScope(Precision p, const at::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool on_ = false, cuda_ = false, prev_enabled_ = false, prev_cache_ = true;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

// Keeps the model's buffers (batch-norm running statistics) across a recomputation: a spot check or
// a replayed micro-shard runs the forward pass in training mode, which must not change the state.
struct BufferGuard {
  explicit BufferGuard(Model& m) : model(m) {
    for (const auto& b : model.buffers()) saved.push_back(b.tensor.detach().clone());
  }
  ~BufferGuard() {
    torch::NoGradGuard ng;
    auto bufs = model.buffers();
    for (std::size_t i = 0; i < bufs.size() && i < saved.size(); ++i) bufs[i].tensor.copy_(saved[i]);
  }
  Model& model;
  std::vector<at::Tensor> saved;
};

}  // namespace culprit::harness
