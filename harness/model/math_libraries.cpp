// The math libraries under libtorch's CPU kernels, pinned and recorded (culprit/math_libraries.h).
//
// What decides their bits, measured on torch 2.11's wheel (docs/determinism.md, "The math
// libraries"): MKL's code branch (AVX2 and AVX-512 give other sgemm bits), ATen's CPU capability
// (its vectorised reductions and pointwise kernels), oneDNN's ISA (bf16 matmuls) and the thread
// count of reductions. MKL is linked into libtorch_cpu statically and exports its service entry
// points (mkl_serv_cbwr_*, what mkl_cbwr_get/set call): culprit sets CNR through them. AUTO, not
// AUTO,STRICT: strict mode (bitwise the same at any thread count) runs other gemm code for some
// shapes than eager PyTorch does (a conv's backward, measured); AUTO gives eager's bits with results
// independent of memory alignment (culprit's parameters are views of one flat buffer), and the
// thread count is culprit's own setting anyway.
#include "culprit/math_libraries.h"

#include "config/run_info.h"

#include <ATen/Version.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>

namespace culprit::harness {

namespace {

// mkl_cbwr.h's values (checked against this MKL: AUTO,STRICT reads back 0x10002).
constexpr int kCbwrAll = ~0;
constexpr int kCbwrBranchOff = 1;
constexpr int kCbwrAuto = 2;
constexpr int kCbwrStrict = 0x10000;  // read back only: culprit does not set it

const char* branch_name(int b) {
  switch (b) {
    case 1: return "OFF";
    case 2: return "AUTO";
    case 3: return "COMPATIBLE";
    case 4: return "SSE2";
    case 6: return "SSSE3";
    case 7: return "SSE4_1";
    case 8: return "SSE4_2";
    case 9: return "AVX";
    case 10: return "AVX2";
    case 12: return "AVX512";
    case 14: return "AVX512_E1";
    default: return nullptr;
  }
}

std::string branch_text(int b) {
  const char* n = branch_name(b);
  return n ? n : "branch " + std::to_string(b);
}

// A symbol of libtorch's CPU library: in the global scope under the executable, only through its
// handle inside Python (torch's extension loads it RTLD_LOCAL).
void* torch_cpu_symbol(const char* name) {
  static void* handle = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
  void* f = handle ? dlsym(handle, name) : nullptr;
  return f ? f : dlsym(RTLD_DEFAULT, name);
}

template <class F>
F mkl(const char* name) {
  return reinterpret_cast<F>(torch_cpu_symbol(name));
}

using CbwrGet = int (*)(int);
using CbwrSet = int (*)(int);
using CbwrAutoBranch = int (*)();

// "MKL-DNN v3.10.2" in libtorch's build description: oneDNN's version.
std::string onednn_version() {
  const std::string config = at::show_config();
  const auto at = config.find("MKL-DNN v");
  if (at == std::string::npos) return "";
  const auto end = config.find_first_of(" \n", at + 8);
  return config.substr(at + 8, end - at - 8);
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

void pin_math_libraries() {
  static const bool pinned = [] {
    const auto get = mkl<CbwrGet>("mkl_serv_cbwr_get");
    const auto set = mkl<CbwrSet>("mkl_serv_cbwr_set");
    const char* env = std::getenv("MKL_CBWR");
    // Fails (and changes nothing) once MKL has computed: the mode read back is what is recorded.
    if (get && set && !(env && *env) && get(kCbwrAll) == kCbwrBranchOff) set(kCbwrAuto);
    if (const auto dynamic = mkl<void (*)(int)>("MKL_Set_Dynamic")) dynamic(0);
    if (const auto omp_dynamic = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_dynamic")))
      omp_dynamic(0);
    return true;
  }();
  (void)pinned;
}

Status check_math_pinned() {
  pin_math_libraries();
  const auto get = mkl<CbwrGet>("mkl_serv_cbwr_get");
  const char* env = std::getenv("MKL_CBWR");
  if (!get || (env && *env) || get(kCbwrAll) != kCbwrBranchOff) return Status::OK();
  return Status::BadInput(
      "MKL computed before culprit was imported, so its reproducible mode (docs/determinism.md, \"The math "
      "libraries\") can no longer be set: import culprit before computing with torch, or set MKL_CBWR=AUTO");
}

MathLibraries math_libraries() {
  pin_math_libraries();
  MathLibraries m;
  m.torch = TORCH_VERSION;
  if (const auto version = mkl<void (*)(char*, int)>("MKL_Get_Version_String")) {
    char buf[256] = {0};
    version(buf, sizeof buf - 1);
    m.blas = trimmed(buf);
  } else {  // the library's name, not its path: the same environment installed elsewhere is the same
    const std::string path = loaded_blas();
    m.blas = path.substr(path.rfind('/') + 1);
  }
  const auto get = mkl<CbwrGet>("mkl_serv_cbwr_get");
  const auto auto_branch = mkl<CbwrAutoBranch>("mkl_serv_cbwr_get_auto_branch");
  if (get) {
    const int mode = get(kCbwrAll);
    const int branch = mode & ~kCbwrStrict;
    m.mkl_cnr = branch_text(branch) + ((mode & kCbwrStrict) ? ",STRICT" : "");
    // The branch AUTO (or no CNR at all) runs on this CPU: what the bits depend on.
    if ((branch == kCbwrAuto || branch == kCbwrBranchOff) && auto_branch)
      m.mkl_cnr += " (" + branch_text(auto_branch()) + ")";
  }
  m.cpu_capability = at::get_cpu_capability();
  if (at::hasMKLDNN()) {
    const char* isa = std::getenv("ONEDNN_MAX_CPU_ISA");
    m.onednn = onednn_version() + ", max ISA " + (isa && *isa ? isa : "the CPU's");
  }
  return m;
}

Status check_math_libraries(const std::string& run_dir, const std::string& doing) {
  MathLibraries was;
  CULPRIT_RETURN_IF_ERROR(read_math_libraries(run_dir, &was));
  if (was.empty()) return Status::OK();
  const std::string d = math_difference(was, math_libraries());
  if (d.empty()) return Status::OK();
  return Status::BadInput("run '" + run_dir + "' was trained under other math libraries: " + d + "; " + doing +
                          " here would not reproduce its bits: run it where they are the run's "
                          "(docs/determinism.md, \"The math libraries\")");
}

}  // namespace culprit::harness
