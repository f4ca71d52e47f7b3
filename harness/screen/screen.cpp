#include <unistd.h>

#include "culprit/screen.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>


#include "culprit/exit_codes.h"
#include "culprit/fingerprint.h"
#include "culprit/records.h"
#include "culprit/fault_spec.h"
#if defined(CULPRIT_HAVE_CUDA)
#include "culprit/screen_cuda.h"
#include "culprit/screen_kernels.h"
#endif
#include "config/run_info.h"
#include "culprit/tensors.h"

namespace culprit::harness {

namespace {

// The inputs: seeded, the same on every device.
struct Inputs {
  at::Tensor a, b;
};

// The screen's kernels, in report order: a name (an injection's layer=) and the CPU computation. The
// GPU runs the same kernels in common/cuda/screen_cuda.cu against screen_kernels.h's reference; a
// kernel added here is added there, in the same place.
struct Kernel {
  const char* name;
  at::Tensor (*run)(const Inputs& in);
};
const Kernel kKernels[] = {
    {"matmul", [](const Inputs& in) { return at::mm(in.a, in.b); }},
    {"reduce", [](const Inputs& in) { return at::sum(in.a * in.b, {1}); }},
    {"pointwise", [](const Inputs& in) { return at::tanh(in.a) * at::exp(-at::abs(in.b)) + in.a * 0.5f; }},
};
static_assert(std::size(kKernels) == 3, "the GPU screen and its CPU reference (screen_kernels.h) run these three");

// An --inject of the screen: a kernel's result, one element of it, corrupted on the ranks and
// repetitions its spec fires (step = a repetition).
struct ScreenFault {
  int kernel = 0;  // index in kKernels
  FaultSpec spec;  // kind, element (index), bit or value, rank or host, step, mode
  std::string host;  // this process's host name (a spec with host= fires only there)
  bool fires(int rank, std::int64_t rep) const {
    return fault_fires(spec, rank, rep, /*replay=*/false, 1, 0, host);
  }
};

std::string kernel_names(const char* sep) {
  std::string s;
  for (const Kernel& k : kKernels) s += (s.empty() ? "" : sep) + std::string(k.name);
  return s;
}

}  // namespace

std::vector<std::string> screen_tests() {
  std::vector<std::string> v;
  for (const Kernel& k : kKernels) v.push_back(k.name);
  return v;
}

namespace {

Inputs make_inputs(int n) {
  at::Generator g = at::detail::createCPUGenerator(20261130);
  Inputs in;
  in.a = at::randn({n, n}, g, at::TensorOptions().dtype(at::kFloat));
  in.b = at::randn({n, n}, g, at::TensorOptions().dtype(at::kFloat));
  return in;
}

// One repetition of kernel t; the result's fingerprint after any injected fault for (rank, rep).
Fingerprint run_test(int t, const Inputs& in, const std::vector<ScreenFault>& faults, int rank, std::int64_t rep) {
  at::Tensor out = kKernels[t].run(in).contiguous();
  for (const auto& f : faults) {
    if (f.kernel != t || !f.fires(rank, rep)) continue;
    float* p = out.data_ptr<float>();
    const std::int64_t i = f.spec.index % out.numel();
    p[i] = corrupt_value(f.spec, p[i]);
  }
  return fingerprint_bytes(out.data_ptr<float>(), static_cast<std::size_t>(out.numel()) * sizeof(float));
}

// Rank 0's report: one line per device, the exclude list (the hosts of devices that did not pass),
// which it fills in; returns the failed devices for the error line ("" when all passed).
std::string print_report(records::ScreenReport& report, bool unresolved) {
  std::printf("culprit screen: %zu device(s), %lld repetition(s) of %s (%dx%d float32) in %.2f s\n",
              report.devices.size(), static_cast<long long>(report.repetitions), kernel_names(", ").c_str(),
              report.size, report.size, report.seconds);
  std::printf("%5s  %-20s %-8s %-12s %s\n", "rank", "host", "device", "verdict",
              ("failures (" + kernel_names(" ") + ")").c_str());
  std::string failed;
  for (const auto& d : report.devices) {
    std::string counts;
    for (int n : d.failures) counts += (counts.empty() ? "" : " ") + std::to_string(n);
    std::printf("%5d  %-20s %-8s %-12s %s%s\n", d.rank, d.host.c_str(), d.device.c_str(), name_of(d.verdict),
                counts.c_str(), d.first_failure ? (" (first at repetition " + std::to_string(d.first_failure) + ")").c_str() : "");
    if (d.verdict == DeviceVerdict::kPass) continue;
    failed += (failed.empty() ? "" : "; ") + std::string("rank ") + std::to_string(d.rank) + " (" + d.host + ", " +
              d.device + "): " + name_of(d.verdict);
    if (std::find(report.exclude.begin(), report.exclude.end(), d.host) == report.exclude.end())
      report.exclude.push_back(d.host);
  }
  std::string ex;
  for (const auto& h : report.exclude) ex += (ex.empty() ? "" : ",") + h;
  std::printf("exclude: %s\n", ex.c_str());
  if (unresolved) std::printf("note: two devices disagree and no majority tells which is right: screen with 3 or more\n");
  std::fflush(stdout);
  return failed;
}

// --inject for the screen: layer= a test's name, step= a repetition.
Status parse_faults(const ScreenOptions& opt, const std::vector<std::string>& tests, std::vector<ScreenFault>* faults) {
  for (const auto& text : opt.inject) {
    FaultSpec f;
    // The screen's computations have no phases: forward stands for "the result".
    CULPRIT_RETURN_IF_ERROR(parse_fault(text.find("phase=") == std::string::npos ? "phase=forward," + text : text, tests, &f));
    f.text = text;
    if (f.layer.empty())
      return Status::BadInput("--inject '" + text + "': screen faults need layer= (one of " + kernel_names(", ") + ")");
    if (opt.device == DeviceKind::kCuda && f.kind != FaultKind::kBitflip)
      return Status::BadInput("--inject '" + text + "': the GPU screen injects kind=bitflip only");
    const int kernel = static_cast<int>(std::find(tests.begin(), tests.end(), f.layer) - tests.begin());
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    faults->push_back({kernel, f, host});
  }
  return Status::OK();
}

// The device a rank screens: the CPU path, or the GPU of its local index. repetition(rep, out)
// computes every test once there; the GPU's known answer is computed once on the CPU (reference).
struct Device {
  std::string name = "cpu";
  std::function<Status(std::int64_t, std::vector<Fingerprint>*)> repetition;
  std::vector<Fingerprint> reference;
  Inputs in;
};

Status open_device(const ScreenOptions& opt, const Comm& comm, const std::vector<ScreenFault>& faults, Device* dev) {
  const auto tests = screen_tests();
  const int T = static_cast<int>(tests.size());
  if (opt.device == DeviceKind::kCpu) {
    dev->in = make_inputs(opt.size);
    dev->repetition = [dev, &faults, T, rank = comm.rank](std::int64_t rep, std::vector<Fingerprint>* out) {
      for (int t = 0; t < T; ++t) (*out)[t] = run_test(t, dev->in, faults, rank, rep);
      return Status::OK();
    };
    return Status::OK();
  }
#if defined(CULPRIT_HAVE_CUDA)
  std::string why;
  const int count = cuda::device_count(&why);
  if (count == 0) return Status::BadInput("--device cuda: no CUDA device on host " + comm.host + " (" + why + ")");
  const int gpu = local_rank(comm) % count;
  dev->name = cuda::device_name(gpu);
  std::vector<float> ref[3];
  screen::reference(opt.size, &ref[0], &ref[1], &ref[2]);
  for (const auto& r : ref) dev->reference.push_back(fingerprint_bytes(r.data(), r.size() * sizeof(float)));
  dev->repetition = [gpu, &faults, size = opt.size, rank = comm.rank](std::int64_t rep, std::vector<Fingerprint>* out) {
    cuda::ScreenFlip flip;
    for (const auto& f : faults)
      if (f.fires(rank, rep)) {
        flip.test = f.kernel;
        flip.index = static_cast<std::size_t>(f.spec.index);
        flip.bit = f.spec.bit;
      }
    return cuda::screen_once(gpu, size, flip, out->data());
  };
  return Status::OK();
#else
  return Status::BadInput("option '--device': this culprit was built without CUDA (nvcc was not found at build time)");
#endif
}

// The known answers: the CPU reference (GPU path) or, per test, what the majority of devices
// computed the first time (all: every rank's first results, rank by rank). resolved[t] is false when
// two results tie: no majority tells which is right.
struct Known {
  std::vector<Fingerprint> answer;
  std::vector<bool> resolved;
};
Known known_answers(const std::vector<Fingerprint>& all, const std::vector<Fingerprint>& reference, int W, int T) {
  Known k{std::vector<Fingerprint>(T), std::vector<bool>(T, true)};
  for (int t = 0; t < T; ++t) {
    if (!reference.empty()) {
      k.answer[t] = reference[t];
      continue;
    }
    std::map<Fingerprint, int> votes;
    for (int r = 0; r < W; ++r) ++votes[all[static_cast<std::size_t>(r) * T + t]];
    int best = 0, ties = 0;
    for (const auto& [fp, n] : votes) {
      if (n > best) best = n, k.answer[t] = fp, ties = 0;
      else if (n == best) ++ties;
    }
    k.resolved[t] = ties == 0;
  }
  return k;
}

// This rank's failures per test and its first failing repetition, over every repetition until
// --seconds have passed on rank 0 (which tells the others each time).
struct Tally {
  std::vector<int> failures;
  std::int64_t first_failure = 0, repetitions = 1;
};
Status repeat(const ScreenOptions& opt, const Comm& comm, const Device& dev, const std::vector<Fingerprint>& first,
              const Known& known, std::chrono::steady_clock::time_point t0, Tally* tally) {
  const int T = static_cast<int>(first.size());
  tally->failures.assign(T, 0);
  for (int t = 0; t < T; ++t)
    if (first[t] != known.answer[t]) ++tally->failures[t], tally->first_failure = 1;
  std::vector<Fingerprint> got(T);
  Status st;
  for (;;) {
    int go = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < opt.seconds && st.ok();
    CULPRIT_MPI_CHECK(MPI_Bcast(&go, 1, MPI_INT, 0, comm.comm));
    if (!go) break;
    const std::int64_t rep = ++tally->repetitions;
    if (!st.ok()) continue;  // a failed device call: reported below
    st = dev.repetition(rep, &got);
    for (int t = 0; t < T && st.ok(); ++t)
      if (got[t] != known.answer[t]) {
        ++tally->failures[t];
        if (!tally->first_failure) tally->first_failure = rep;
      }
  }
  return agree(comm, st);
}

// Rank 0's account of every device (counts: each rank's failures per test, then its first failing
// repetition; all: each rank's first results).
records::ScreenReport gather_report(const ScreenOptions& opt, const Comm& comm, const Device& dev, const Tally& tally,
                                    const Known& known, const std::vector<Fingerprint>& all, double seconds) {
  const auto tests = screen_tests();
  const int T = static_cast<int>(tests.size()), W = comm.size;
  std::vector<int> mine(tally.failures);
  mine.push_back(static_cast<int>(tally.first_failure));
  std::vector<int> counts(static_cast<std::size_t>(T + 1) * W);
  CULPRIT_MPI_CHECK(MPI_Gather(mine.data(), T + 1, MPI_INT, counts.data(), T + 1, MPI_INT, 0, comm.comm));
  const std::vector<std::string> hosts = gather_strings(comm, comm.host);
  const std::vector<std::string> devices = gather_strings(comm, dev.name);
  records::ScreenReport report{tests, opt.size, tally.repetitions, seconds, {}, {}};
  for (int r = 0; r < W && comm.rank == 0; ++r) {
    const int* c = counts.data() + static_cast<std::size_t>(T + 1) * r;
    records::ScreenDevice d{r, hosts[r], devices[r], DeviceVerdict::kPass, std::vector<int>(c, c + T), c[T]};
    bool unresolved = false;
    for (int t = 0; t < T; ++t)
      unresolved = unresolved || (!known.resolved[t] && all[static_cast<std::size_t>(r) * T + t] != known.answer[t]) ||
                   (!known.resolved[t] && c[t] == 0 && W == 2);
    d.verdict = unresolved                                                  ? DeviceVerdict::kUnresolved
                : std::any_of(c, c + T, [](int n) { return n > 0; }) ? DeviceVerdict::kFail
                                                                      : DeviceVerdict::kPass;
    report.devices.push_back(d);
  }
  return report;
}

}  // namespace

Status screen(const ScreenOptions& opt, const Comm& comm) {
  const auto tests = screen_tests();
  const int T = static_cast<int>(tests.size());
  std::vector<ScreenFault> faults;
  Device dev;
  Status st = screen_options().validate(opt);
  if (st.ok()) st = parse_faults(opt, tests, &faults);
  if (st.ok()) st = open_device(opt, comm, faults, &dev);
  CULPRIT_RETURN_IF_ERROR(agree(comm, st));
  setup_determinism(opt.threads);
  // Repetition 1 on every device gives the known answers; the others must reproduce them.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Fingerprint> first(T);
  CULPRIT_RETURN_IF_ERROR(agree(comm, dev.repetition(1, &first)));
  std::vector<Fingerprint> all(static_cast<std::size_t>(T) * comm.size);
  CULPRIT_MPI_CHECK(MPI_Allgather(first.data(), T, MPI_UINT64_T, all.data(), T, MPI_UINT64_T, comm.comm));
  const Known known = known_answers(all, dev.reference, comm.size, T);
  Tally tally;
  CULPRIT_RETURN_IF_ERROR(repeat(opt, comm, dev, first, known, t0, &tally));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  records::ScreenReport report = gather_report(opt, comm, dev, tally, known, all, seconds);
  std::string failed;
  Status written;
  if (comm.rank == 0) {
    failed = print_report(report, std::any_of(known.resolved.begin(), known.resolved.end(), [](bool b) { return !b; }));
    if (!opt.report.empty()) written = records::write_screen_report(opt.report, report);
  }
  CULPRIT_RETURN_IF_ERROR(agree(comm, written));
  failed = broadcast_string(comm, failed);
  if (!failed.empty()) return Status::Error(StatusCode::kHardware, "device(s) failed the screen: " + failed);
  return Status::OK();
}

}  // namespace culprit::harness
