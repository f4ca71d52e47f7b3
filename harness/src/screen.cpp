#include "culprit/screen.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "culprit/exit_codes.h"
#include "culprit/fingerprint.h"
#include "culprit/inject.h"
#if defined(CULPRIT_HAVE_CUDA)
#include "culprit/screen_cuda.h"
#include "culprit/screen_kernels.h"
#endif
#include "runinfo.h"
#include "tensors.h"

namespace culprit::harness {

std::vector<std::string> screen_tests() { return {"matmul", "reduce", "pointwise"}; }

namespace {

// The inputs: seeded, the same on every device.
struct Inputs {
  at::Tensor a, b;
};

Inputs make_inputs(int n) {
  at::Generator g = at::detail::createCPUGenerator(20261130);
  Inputs in;
  in.a = at::randn({n, n}, g, at::TensorOptions().dtype(at::kFloat));
  in.b = at::randn({n, n}, g, at::TensorOptions().dtype(at::kFloat));
  return in;
}

// One repetition of test t; the result's fingerprint after any injected fault for (rank, rep).
Fingerprint run_test(int t, const Inputs& in, const std::vector<FaultSpec>& faults, int rank, std::int64_t rep) {
  at::Tensor out;
  switch (t) {
    case 0: out = at::mm(in.a, in.b); break;
    case 1: out = at::sum(in.a * in.b, {1}); break;
    default: out = at::tanh(in.a) * at::exp(-at::abs(in.b)) + in.a * 0.5f; break;
  }
  out = out.contiguous();
  const auto name = screen_tests()[static_cast<std::size_t>(t)];
  for (const auto& f : faults) {
    if (f.layer != name || !fault_fires(f, rank, rep, /*replay=*/false, 1, 0)) continue;
    float* p = out.data_ptr<float>();
    const std::int64_t i = f.index % out.numel();
    p[i] = corrupt_value(f, p[i]);
  }
  return fingerprint_bytes(out.data_ptr<float>(), static_cast<std::size_t>(out.numel()) * sizeof(float));
}

}  // namespace

Status screen(const ScreenOptions& opt, const Comm& comm) {
  const int W = comm.size;
  const auto tests = screen_tests();
  const int T = static_cast<int>(tests.size());
  Status st;
  if (opt.size < 1 || opt.size > 8192) st = Status::Error("option '--size' must be in 1..8192");
  if (st.ok() && !(opt.seconds >= 0)) st = Status::Error("option '--seconds' must be at least 0");
  if (st.ok() && opt.device != "cpu" && opt.device != "cuda")
    st = Status::Error("option '--device': unknown device '" + opt.device + "' (valid: cpu, cuda)");
#if !defined(CULPRIT_HAVE_CUDA)
  if (st.ok() && opt.device == "cuda")
    st = Status::Error("option '--device': this culprit was built without CUDA (nvcc was not found at build time)");
#endif
  std::vector<FaultSpec> faults;
  for (const auto& text : opt.inject) {
    if (!st.ok()) break;
    FaultSpec f;
    // The screen's computations have no phases: forward stands for "the result".
    st = parse_fault(text.find("phase=") == std::string::npos ? "phase=forward," + text : text, tests, &f);
    f.text = text;
    if (st.ok() && f.layer.empty()) st = Status::Error("--inject '" + text + "': screen faults need layer= (one of matmul, reduce, pointwise)");
    if (st.ok() && opt.device == "cuda" && f.kind != FaultKind::kBitflip)
      st = Status::Error("--inject '" + text + "': the GPU screen injects kind=bitflip only");
    faults.push_back(f);
  }
  // The device: the CPU path, or the GPU of this rank's local index.
  std::string device = "cpu";
  int gpu = -1;
#if defined(CULPRIT_HAVE_CUDA)
  if (st.ok() && opt.device == "cuda") {
    std::string why;
    const int count = cuda::device_count(&why);
    if (count == 0) st = Status::Error("--device cuda: no CUDA device on host " + comm.host + " (" + why + ")");
    else gpu = local_rank(comm) % count, device = cuda::device_name(gpu);
  }
#endif
  CULPRIT_RETURN_IF_ERROR(agree(comm, st));
  setup_determinism(opt.threads);
  // One repetition: each test's result fingerprint on this rank's device.
  std::function<Status(std::int64_t, std::vector<Fingerprint>*)> repetition;
  std::vector<Fingerprint> reference;  // the GPU path's known answer, computed once on the CPU
  Inputs in;
  if (gpu < 0) {
    in = make_inputs(opt.size);
    repetition = [&](std::int64_t rep, std::vector<Fingerprint>* out) {
      for (int t = 0; t < T; ++t) (*out)[t] = run_test(t, in, faults, comm.rank, rep);
      return Status::OK();
    };
  } else {
#if defined(CULPRIT_HAVE_CUDA)
    std::vector<float> ref[3];
    screen::reference(opt.size, &ref[0], &ref[1], &ref[2]);
    for (const auto& r : ref) reference.push_back(fingerprint_bytes(r.data(), r.size() * sizeof(float)));
    repetition = [&](std::int64_t rep, std::vector<Fingerprint>* out) {
      cuda::ScreenFlip flip;
      for (const auto& f : faults)
        if (fault_fires(f, comm.rank, rep, /*replay=*/false, 1, 0)) {
          flip.test = static_cast<int>(std::find(tests.begin(), tests.end(), f.layer) - tests.begin());
          flip.index = static_cast<std::size_t>(f.index);
          flip.bit = f.bit;
        }
      return cuda::screen_once(gpu, opt.size, flip, out->data());
    };
#endif
  }

  // Repetition 1 on every device; the known answer is the CPU reference (GPU) or what the majority
  // of devices computed (CPU path).
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Fingerprint> first(T);
  st = repetition(1, &first);
  CULPRIT_RETURN_IF_ERROR(agree(comm, st));
  std::vector<Fingerprint> all(static_cast<std::size_t>(T) * W);
  CULPRIT_MPI_CHECK(MPI_Allgather(first.data(), T, MPI_UINT64_T, all.data(), T, MPI_UINT64_T, comm.comm));
  std::vector<Fingerprint> known(T);
  std::vector<bool> resolved(T, true);
  for (int t = 0; t < T; ++t) {
    if (!reference.empty()) {
      known[t] = reference[t];
      continue;
    }
    std::map<Fingerprint, int> votes;
    for (int r = 0; r < W; ++r) ++votes[all[static_cast<std::size_t>(r) * T + t]];
    int best = 0, ties = 0;
    for (const auto& [fp, n] : votes) {
      if (n > best) best = n, known[t] = fp, ties = 0;
      else if (n == best) ++ties;
    }
    resolved[t] = ties == 0;  // two devices that disagree: no majority
  }
  // Further repetitions until --seconds have passed on rank 0 (which tells the others each time).
  std::vector<int> failures(T, 0);
  std::int64_t first_failure = 0, reps = 1;
  for (int t = 0; t < T; ++t)
    if (first[t] != known[t]) ++failures[t], first_failure = 1;
  std::vector<Fingerprint> got(T);
  for (;;) {
    int go = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < opt.seconds && st.ok();
    CULPRIT_MPI_CHECK(MPI_Bcast(&go, 1, MPI_INT, 0, comm.comm));
    if (!go) break;
    ++reps;
    if (!st.ok()) continue;  // a failed device call: reported below
    st = repetition(reps, &got);
    for (int t = 0; t < T && st.ok(); ++t)
      if (got[t] != known[t]) {
        ++failures[t];
        if (!first_failure) first_failure = reps;
      }
  }
  CULPRIT_RETURN_IF_ERROR(agree(comm, st));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Rank 0 gathers every device's account.
  std::vector<int> mine(failures);
  mine.push_back(static_cast<int>(first_failure));
  std::vector<int> counts(static_cast<std::size_t>(T + 1) * W);
  CULPRIT_MPI_CHECK(MPI_Gather(mine.data(), T + 1, MPI_INT, counts.data(), T + 1, MPI_INT, 0, comm.comm));
  const std::vector<std::string> hosts = gather_strings(comm, comm.host);
  const std::vector<std::string> devices = gather_strings(comm, device);
  std::string verdict_msg;
  Status written;
  if (comm.rank == 0) {
    nlohmann::ordered_json j;
    j["tests"] = tests;
    j["size"] = opt.size;
    j["repetitions"] = reps;
    j["seconds"] = seconds;
    j["devices"] = nlohmann::ordered_json::array();
    std::vector<std::string> exclude, failed;
    std::printf("culprit screen: %d device(s), %lld repetition(s) of %s (%dx%d float32) in %.2f s\n", W,
                static_cast<long long>(reps), "matmul, reduce, pointwise", opt.size, opt.size, seconds);
    std::printf("%5s  %-20s %-8s %-12s %s\n", "rank", "host", "device", "verdict", "failures (matmul reduce pointwise)");
    for (int r = 0; r < W; ++r) {
      const int* c = counts.data() + static_cast<std::size_t>(T + 1) * r;
      int total = 0;
      bool unresolved = false;
      for (int t = 0; t < T; ++t) {
        total += c[t];
        unresolved = unresolved || (!resolved[t] && all[static_cast<std::size_t>(r) * T + t] != known[t]) ||
                     (!resolved[t] && c[t] == 0 && W == 2);
      }
      const std::string verdict = unresolved ? "unresolved" : total ? "fail" : "pass";
      std::printf("%5d  %-20s %-8s %-12s %d %d %d%s\n", r, hosts[r].c_str(), devices[r].c_str(), verdict.c_str(), c[0],
                  c[1], c[2], c[T] ? (" (first at repetition " + std::to_string(c[T]) + ")").c_str() : "");
      nlohmann::ordered_json d = {{"rank", r}, {"host", hosts[r]}, {"device", devices[r]}, {"verdict", verdict}};
      for (int t = 0; t < T; ++t) d["failures"][tests[t]] = c[t];
      d["first_failure"] = c[T] ? nlohmann::ordered_json(c[T]) : nlohmann::ordered_json(nullptr);
      j["devices"].push_back(d);
      if (verdict != "pass") {
        failed.push_back("rank " + std::to_string(r) + " (" + hosts[r] + ", " + devices[r] + "): " + verdict);
        if (std::find(exclude.begin(), exclude.end(), hosts[r]) == exclude.end()) exclude.push_back(hosts[r]);
      }
    }
    std::string ex;
    for (const auto& h : exclude) ex += (ex.empty() ? "" : ",") + h;
    j["exclude"] = ex;
    std::printf("exclude: %s\n", ex.c_str());
    if (std::any_of(resolved.begin(), resolved.end(), [](bool b) { return !b; }))
      std::printf("note: two devices disagree and no majority tells which is right: screen with 3 or more\n");
    std::fflush(stdout);
    if (!opt.report.empty()) {
      std::ofstream out(opt.report);
      out << j.dump(2) << "\n";
      if (!out) written = Status::Error("cannot write the report '" + opt.report + "'");
    }
    for (const auto& f : failed) verdict_msg += (verdict_msg.empty() ? "" : "; ") + f;
  }
  CULPRIT_RETURN_IF_ERROR(agree(comm, written));
  verdict_msg = broadcast_string(comm, verdict_msg);
  if (!verdict_msg.empty()) return Status::Error("device(s) failed the screen: " + verdict_msg, kExitHardware);
  return Status::OK();
}

}  // namespace culprit::harness
