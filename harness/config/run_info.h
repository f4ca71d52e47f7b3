// What a run records about itself (RUN/run.json): configuration, world, software, BLAS, threads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/harness.h"
#include "culprit/status.h"

namespace culprit::harness {

struct RunInfo {
  std::string config_ini;
  int world_size = 1;
  std::vector<std::string> hosts;    // per rank
  std::vector<std::string> devices;  // per rank
  std::string culprit_version;
  std::string torch_version;
  std::string mpi_version;
  std::string hdf5_version;
  std::string blas_library;  // the BLAS shared object actually loaded
  int blas_threads = 0;      // 0: the BLAS has no thread control
  int intra_op_threads = 1;
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

// Fills the MPI/HDF5 versions, the loaded BLAS, time and Slurm job id (local, no collectives).
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
