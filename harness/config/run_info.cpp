#include "config/run_info.h"

#include <dlfcn.h>
#include <hdf5.h>

#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

#include "culprit/run_files.h"

namespace culprit::harness {

// The loaded BLAS: the first mapped shared object whose name mentions blas.
std::string loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string base = path.substr(path.rfind('/') + 1);
    if (base.find("blas") != std::string::npos || base.find("mkl_rt") != std::string::npos) return path;
  }
  return "none found (libtorch's own kernels)";
}

void fill_environment(RunInfo* info) {
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(mpi, &len);
  std::string m(mpi, len);
  info->mpi_version = m.substr(0, m.find_first_of(",\n"));
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  info->hdf5_version = std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel);
  int provided = 0;
  MPI_Query_thread(&provided);
  info->mpi_thread_level = provided == MPI_THREAD_MULTIPLE   ? "multiple"
                           : provided == MPI_THREAD_SERIALIZED ? "serialized"
                           : provided == MPI_THREAD_FUNNELED   ? "funneled"
                                                               : "single";
  if (const char* j = std::getenv("SLURM_JOB_ID")) info->slurm_job_id = j;
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  info->created = buf;
}

std::vector<std::string> gather_strings(const Comm& comm, const std::string& text) {
  constexpr int kLen = 256;
  std::vector<char> mine(kLen, 0), all(static_cast<std::size_t>(kLen) * comm.size, 0);
  std::snprintf(mine.data(), kLen, "%s", text.c_str());
  CULPRIT_MPI_CHECK(MPI_Allgather(mine.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm.comm));
  std::vector<std::string> out;
  for (int r = 0; r < comm.size; ++r) out.emplace_back(all.data() + static_cast<std::size_t>(r) * kLen);
  return out;
}

int local_rank(const Comm& comm) {
  MPI_Comm node;
  CULPRIT_MPI_CHECK(MPI_Comm_split_type(comm.comm, MPI_COMM_TYPE_SHARED, comm.rank, MPI_INFO_NULL, &node));
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

void gather_hosts(const Comm& comm, RunInfo* info) { info->hosts = gather_strings(comm, comm.host); }

Status write_run_json(const std::string& path, const RunInfo& i) {
  nlohmann::ordered_json j;
  j["run_id"] = i.run_id;
  j["culprit_version"] = i.culprit_version;
  j["created"] = i.created;
  j["model"] = i.model;
  j["parameters"] = i.parameters;
  j["data"] = {{"source", i.data_source}, {"samples", i.data_samples}};
  j["world_size"] = i.world_size;
  j["hosts"] = i.hosts;
  j["devices"] = i.devices;
  j["slurm_job_id"] = i.slurm_job_id;
  j["versions"] = {{"libtorch", i.torch_version}, {"mpi", i.mpi_version}, {"hdf5", i.hdf5_version}};
  j["blas"] = {{"library", i.blas_library}, {"threads", i.blas_threads}};
  j["intra_op_threads"] = i.intra_op_threads;
  j["math"] = {{"torch", i.math.torch},
               {"blas", i.math.blas},
               {"mkl_cnr", i.math.mkl_cnr},
               {"cpu_capability", i.math.cpu_capability},
               {"onednn", i.math.onednn}};
  j["mpi_thread_level"] = i.mpi_thread_level;
  j["deterministic_algorithms"] = true;
  if (!i.resumed_from.empty()) j["resumed_from"] = {{"checkpoint", i.resumed_from}, {"step", i.resumed_at_step}};
  j["config"] = i.config_ini;
  // Replaced whole or not at all: a failed start (full disk) leaves no empty or torn run.json.
  return files::write_atomic(path, j.dump(2) + "\n");
}

std::string math_difference(const MathLibraries& was, const MathLibraries& now) {
  const struct {
    const char* what;
    const std::string& a;
    const std::string& b;
  } fields[] = {{"libtorch", was.torch, now.torch},
                {"the BLAS", was.blas, now.blas},
                {"MKL's CNR mode (MKL_CBWR)", was.mkl_cnr, now.mkl_cnr},
                {"ATen's CPU capability (ATEN_CPU_CAPABILITY)", was.cpu_capability, now.cpu_capability},
                {"oneDNN (ONEDNN_MAX_CPU_ISA)", was.onednn, now.onednn}};
  // An empty field was not recorded (a run from before the math libraries were: its libtorch only).
  for (const auto& f : fields)
    if (!f.a.empty() && f.a != f.b) return std::string(f.what) + " was '" + f.a + "', here '" + f.b + "'";
  return "";
}

Status read_math_libraries(const std::string& run_dir, MathLibraries* out) {
  *out = MathLibraries{};
  const std::string path = run_dir + "/run.json";
  std::string text;
  bool absent = false;
  CULPRIT_RETURN_IF_ERROR(files::read_regular(path, files::kMaxJsonRecordBytes, "a culprit run.json", &text, &absent));
  if (absent) return Status::OK();  // a new run: nothing recorded to reproduce
  try {
    const auto j = nlohmann::json::parse(text);
    if (!j.contains("math")) {
      // A run from before the math libraries were recorded: its libtorch version (1.13's builds).
      if (j.contains("versions") && j.at("versions").contains("libtorch"))
        out->torch = j.at("versions").at("libtorch").get<std::string>();
      return Status::OK();
    }
    const auto& m = j.at("math");
    *out = {m.at("torch").get<std::string>(), m.at("blas").get<std::string>(), m.at("mkl_cnr").get<std::string>(),
            m.at("cpu_capability").get<std::string>(), m.at("onednn").get<std::string>()};
  } catch (const std::exception&) {
    return Status::Damaged("'" + path + "' is not a culprit run.json (its math libraries)");
  }
  return Status::OK();
}

std::string format_json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace culprit::harness
