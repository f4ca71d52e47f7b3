// What a run records about itself (RUN/run.json): configuration, world, software, BLAS, threads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/harness.h"
#include "culprit/status.h"

namespace culprit::harness {

// What decides the bits of libtorch's CPU kernels besides culprit's own order of operations
// (docs/determinism.md, "The math libraries"): a replay, bisection, audit or resume under other
// values would not reproduce the run's bits, and is refused (math_difference).
struct MathLibraries {
  std::string torch;           // libtorch's version
  std::string blas;            // MKL's version, or the BLAS library loaded
  std::string mkl_cnr;         // MKL's conditional numerical reproducibility mode and the branch it runs
  std::string cpu_capability;  // ATen's kernel dispatch (AVX2, AVX512, ...; ATEN_CPU_CAPABILITY pins it)
  std::string onednn;          // oneDNN's version and ONEDNN_MAX_CPU_ISA ("" without oneDNN)
  bool empty() const { return torch.empty(); }
};
// "" when a run recorded under `recorded` reproduces under `now`; else one clause naming what
// differs ("MKL's CNR mode (MKL_CBWR) was 'AUTO (AVX512_E1)', here 'AUTO (AVX2)'"). Fields recorded
// empty are not compared (a run from before the math libraries were recorded: its libtorch only).
std::string math_difference(const MathLibraries& recorded, const MathLibraries& now);
// The math libraries RUN/run.json recorded (empty: no run there, or one from before they were recorded).
Status read_math_libraries(const std::string& run_dir, MathLibraries* out);

// The BLAS shared object this process loaded (a libtorch without MKL).
std::string loaded_blas();

struct RunInfo {
  std::string config_ini;
  int world_size = 1;
  std::vector<std::string> hosts;    // per rank
  std::vector<std::string> devices;  // per rank
  std::string culprit_version;
  std::string torch_version;
  std::string mpi_version;
  std::string hdf5_version;
  std::string blas_library;  // the BLAS in use: math.blas (MKL's version, or the library loaded)
  int blas_threads = 0;      // 0: the BLAS has no thread control
  int intra_op_threads = 1;
  MathLibraries math;
  std::string mpi_thread_level;
  std::string data_source;
  std::int64_t data_samples = 0;
  std::int64_t parameters = 0;
  std::string model;
  std::string slurm_job_id;
  std::string created;  // ISO 8601 UTC
  std::string run_id;        // the run's identity (TrainConfig::run_id)
  std::string resumed_from;  // checkpoint a resumed run started from
  std::int64_t resumed_at_step = 0;
};

// Fills the MPI/HDF5 versions, time and Slurm job id (local, no collectives); the BLAS is the math
// libraries' (culprit/math_libraries.h).
void fill_environment(RunInfo* info);
// Collective: gathers every rank's host name into info->hosts.
void gather_hosts(const Comm& comm, RunInfo* info);
// This process's index among the ranks on its host (one GPU per rank by local rank); collective.
int local_rank(const Comm& comm);
// Every rank's `mine` (at most 255 bytes), in rank order; collective.
std::vector<std::string> gather_strings(const Comm& comm, const std::string& mine);
Status write_run_json(const std::string& path, const RunInfo& info);
std::string format_json_number(double v);  // JSON number, or "null" when not finite

}  // namespace culprit::harness
