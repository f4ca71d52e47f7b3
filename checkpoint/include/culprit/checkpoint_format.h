// The checkpoint and trace file formats as constants. Prose: docs/checkpoint-format.md.
#pragma once
#include <cstdint>

namespace culprit::format {

// ---- checkpoints: RUN/checkpoints/step-XXXXXXXX.h5 (8 digits: completed steps) ----
constexpr std::int64_t kCheckpointVersion = 1;
constexpr const char* kCheckpointDir = "checkpoints";
constexpr const char* kCheckpointPrefix = "step-";
constexpr const char* kCheckpointSuffix = ".h5";
constexpr const char* kTempSuffix = ".tmp";  // written under this name, renamed when complete
constexpr int kStepDigits = 8;

// Groups.
constexpr const char* kMeta = "meta";            // attributes only
constexpr const char* kModel = "model";          // /model/<state-dict name>
constexpr const char* kOptimizer = "optimizer";  // /optimizer/<param name>/<state name>
constexpr const char* kRng = "rng";              // /rng/<generator>: its state bytes (uint8)
constexpr const char* kData = "data";            // /data/epoch, /data/cursor (int64 scalars)

// Attributes.
constexpr const char* kAttrFingerprint = "fingerprint";            // uint64 on every dataset
constexpr const char* kAttrFormatVersion = "format_version";       // int64, /meta
constexpr const char* kAttrStateFingerprint = "state_fingerprint"; // uint64, /meta
constexpr const char* kAttrFingerprintFormat = "fingerprint_format";  // "fp1", /meta

// The other /meta attributes (int64 and string), read by name.
constexpr const char* kMetaInts[] = {"format_version", "step", "seed", "world_size", "micro_shards", "global_batch",
                                     "intra_op_threads", "blas_threads", "data_samples"};
constexpr const char* kMetaStrings[] = {"fingerprint_format", "state_fingerprint_hex", "config", "model", "optimizer",
                                        "data", "culprit_version", "libtorch_version", "mpi_version", "hdf5_version",
                                        "blas", "created", "slurm_job_id", "hosts", "devices", "run_id"};

// Tensors at least this large are split across ranks when written.
constexpr std::uint64_t kSliceBytes = 1 << 20;

// ---- trace: RUN/trace/rank-RRRRR.h5, one file per rank ----
// 2: micro-shard input and parameter-gradient fingerprints; 3: every row's checksum, the writer's
// world, its reduced chunk's and optimizer state's fingerprints, every sample's fingerprint; 4: the
// reduced gradient's fingerprint per parameter; 5: the rank's --shard-optimizer slice (column
// "shard": lo, hi, its parameters' and optimizer state's fingerprints; zeros when not sharded).
// 6: every optimizer group's learning rate (column "lrs_fp": their fingerprint).
constexpr std::int64_t kTraceVersion = 6;
constexpr std::int64_t kShardColumns = 4;
constexpr std::int64_t kTraceOldestReadable = 2;  // read without row checksums (TraceFile::verified)
constexpr const char* kTraceDir = "trace";
constexpr const char* kTracePrefix = "rank-";
constexpr const char* kTraceSealedInfix = ".to-";  // rank-RRRRR.to-SSSSSSSS.h5: sealed, rows through step S
constexpr int kRankDigits = 5;
constexpr const char* kAttrStepsCommitted = "steps_committed";    // rows of /steps valid
constexpr const char* kAttrShardsCommitted = "shards_committed";  // rows of /shards valid
constexpr const char* kAttrSamplesPerShard = "samples_per_shard";  // int64: width of /shards/sample_fp
// string: the run that wrote the file (RUN/run.json "run_id"); optional (files from before run
// identities lack it). Checkpoints carry it as /meta attribute kMetaRunId.
constexpr const char* kAttrRunId = "run_id";
constexpr const char* kMetaRunId = "run_id";
// A row's checksum (column row_check): the fingerprint (fp1) of kRowCheckSeed, the file's rank and
// the row's index (int64 each), then the row's fields in column order (strings as their fixed-width
// bytes), so a row moved, copied from another rank's file or changed in any bit fails it.
constexpr std::uint64_t kRowCheckSeed = 0x63756c7072697433ULL;  // "culprit3"
constexpr std::int64_t kTraceChunkRows = 64;
constexpr int kHostChars = 64;
constexpr int kDeviceChars = 16;

}  // namespace culprit::format
