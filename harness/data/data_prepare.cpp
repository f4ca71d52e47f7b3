#include "data/data_prepare.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "culprit/h5.h"
#include "culprit/run_files.h"

namespace culprit::harness {

namespace {

using json = nlohmann::json;

std::string record_path(const DataSpec& d) { return d.path + kDataRecordSuffix; }

Status stat_file(const std::string& path, std::uint64_t* bytes, std::int64_t* mtime_ns) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return Status::BadInput("data file '" + path + "': " + (errno ? std::strerror(errno) : "not a regular file"));
  *bytes = static_cast<std::uint64_t>(st.st_size);
  *mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return Status::OK();
}

// Reads the file's bytes [offset, offset + n) (short at the end of the file).
Status read_bytes(int fd, const std::string& path, std::uint64_t offset, std::size_t n, std::vector<unsigned char>* out) {
  out->resize(n);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out->data() + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::IoError("cannot read data file '" + path + "': " + std::strerror(errno));
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  out->resize(got);
  return Status::OK();
}

// Calls f(i, fingerprint) for the blocks of the file that meet [lo, hi) (all: lo = 0, hi = size).
template <class F>
Status each_block(const std::string& path, std::uint64_t block, std::uint64_t size, std::uint64_t lo, std::uint64_t hi, F f) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::BadInput("cannot open data file '" + path + "': " + std::strerror(errno));
  std::vector<unsigned char> buf;
  Status st;
  for (std::uint64_t b = lo / block; st.ok() && b * block < std::min(hi, size); ++b) {
    st = read_bytes(fd, path, b * block, static_cast<std::size_t>(std::min(block, size - b * block)), &buf);
    if (st.ok()) f(static_cast<std::size_t>(b), fingerprint_bytes(buf.data(), buf.size()));
  }
  ::close(fd);
  return st;
}

// The data opened as `culprit train` would open it, without the scan (window > 0: a tokens file in
// windows of that many tokens).
Status open_unscanned(const TrainConfig& cfg, Dataset* d, std::int64_t window = 0) {
  *d = Dataset();
  if (cfg.data.kind == DataKind::kHdf5) return open_hdf5(cfg, cfg.data.path, d);
  if (cfg.data.kind == DataKind::kTokens) return open_tokens(cfg, cfg.data.path, d, window);
  return Status::BadInput("synthetic data has no file to prepare or verify: give --data hdf5:PATH or tokens:PATH");
}

// The record beside a file is that file's, whatever path reached it (relative or absolute, through
// a link, moved with its record): only the kind of source it was made for must match.
bool same_kind(const std::string& recorded, const DataSpec& data) {
  const std::string want = data.text();
  return recorded.substr(0, recorded.find(':')) == want.substr(0, want.find(':'));
}

}  // namespace

Status write_data_record(const std::string& path, const DataRecord& r) {
  json j = {{"schema", kDataRecordSchema},       {"version", kDataRecordVersion}, {"data", r.data},
            {"file_bytes", r.file_bytes},        {"mtime_ns", r.mtime_ns},        {"samples", r.samples},
            {"token_bytes", r.token_bytes},
            {"max_label", r.max_label},          {"max_label_at", r.max_label_at}, {"max_token", r.max_token},
            {"block_bytes", r.block_bytes},      {"blocks", json::array()}};
  for (Fingerprint f : r.blocks) j["blocks"].push_back(fingerprint_hex(f));
  return files::write_atomic(path, j.dump(1) + "\n");
}

Status read_data_record(const std::string& path, DataRecord* r) {
  std::ifstream in(path);
  if (!in) return Status::BadInput("no data record '" + path + "': run culprit prepare-data first");
  const std::string where = "data record '" + path + "'";
  try {
    json j;
    in >> j;
    if (j.at("schema").get<std::string>() != kDataRecordSchema) return Status::Damaged(where + ": not a culprit data record");
    if (j.at("version").get<int>() != kDataRecordVersion)
      return Status::BadInput(where + " has version " + std::to_string(j.at("version").get<int>()) + "; this culprit reads " +
                              std::to_string(kDataRecordVersion));
    r->data = j.at("data").get<std::string>();
    r->file_bytes = j.at("file_bytes").get<std::uint64_t>();
    r->mtime_ns = j.at("mtime_ns").get<std::int64_t>();
    r->samples = j.at("samples").get<std::int64_t>();
    r->token_bytes = j.value("token_bytes", -1);  // absent (an older record): not known
    r->max_label = j.at("max_label").get<std::int64_t>();
    r->max_label_at = j.at("max_label_at").get<std::int64_t>();
    r->max_token = j.at("max_token").get<std::int64_t>();
    r->block_bytes = j.at("block_bytes").get<std::uint64_t>();
    r->blocks.clear();
    for (const auto& h : j.at("blocks")) r->blocks.push_back(std::stoull(h.get<std::string>(), nullptr, 16));
  } catch (const std::exception& e) {
    return Status::Damaged(where + ": " + e.what());
  }
  if (r->block_bytes == 0 || r->blocks.size() != (r->file_bytes + r->block_bytes - 1) / r->block_bytes)
    return Status::Damaged(where + ": its blocks do not cover the file's " + std::to_string(r->file_bytes) + " bytes");
  return Status::OK();
}

bool find_prepared(const DataSpec& data, const Dataset& d, PreparedFacts* out) {
  DataRecord r;
  std::uint64_t bytes = 0;
  std::int64_t mtime = 0;
  if (data.kind == DataKind::kSynthetic || !read_data_record(record_path(data), &r).ok() || !same_kind(r.data, data) ||
      !stat_file(data.path, &bytes, &mtime).ok() || bytes != r.file_bytes || mtime != r.mtime_ns ||
      r.token_bytes != d.token_bytes)  // a file read as uint16 says nothing of it as uint32
    return false;
  out->max_label = r.max_label;
  out->max_label_at = r.max_label_at;
  out->max_token = r.max_token;
  return true;
}

Status changed_samples(const TrainConfig& cfg, const std::vector<std::int64_t>& samples, std::vector<DamagedSample>* out,
                       std::string* skipped) {
  out->clear();
  DataRecord r;
  if (cfg.data.kind == DataKind::kSynthetic || !read_data_record(record_path(cfg.data), &r).ok()) return Status::OK();
  std::uint64_t bytes = 0;
  std::int64_t mtime = 0;
  CULPRIT_RETURN_IF_ERROR(stat_file(cfg.data.path, &bytes, &mtime));
  // A record of another file (another kind, another size: the file was made again on purpose) says
  // nothing about this one's bytes. One of the same size is compared (damage keeps the size).
  if (!same_kind(r.data, cfg.data) || bytes != r.file_bytes) {
    if (skipped)
      *skipped = "the data record " + record_path(cfg.data) + " is of " + r.data + ", " + std::to_string(r.file_bytes) +
                 " bytes; the file holds " + std::to_string(bytes) + ": not compared (run culprit prepare-data again)";
    return Status::OK();
  }
  Dataset d;
  CULPRIT_RETURN_IF_ERROR(open_unscanned(cfg, &d));
  std::map<std::uint64_t, bool> changed;  // each block read once, however many samples share it
  for (std::int64_t s : samples) {
    if (s < 0 || s >= d.n) continue;
    const SampleLocation loc = d.reader->locate(s, SamplePart::kX);
    std::uint64_t bad = UINT64_MAX;
    for (std::uint64_t b = loc.offset / r.block_bytes; b * r.block_bytes < std::min(bytes, loc.offset + loc.bytes); ++b) {
      if (!changed.count(b))
        CULPRIT_RETURN_IF_ERROR(each_block(cfg.data.path, r.block_bytes, bytes, b * r.block_bytes, (b + 1) * r.block_bytes,
                                           [&](std::size_t i, Fingerprint fp) {
                                             changed[b] = i >= r.blocks.size() || r.blocks[i] != fp;
                                           }));
      if (changed[b] && bad == UINT64_MAX) bad = b;
    }
    if (bad != UINT64_MAX) out->push_back({s, loc, bad * r.block_bytes, std::min(r.block_bytes, bytes - bad * r.block_bytes)});
  }
  return Status::OK();
}

// ---- the commands ----

namespace {

struct DataArgs {
  DataSpec data;
  TokenDType token_dtype = TokenDType::kAuto;
  std::int64_t seq_len = 0, vocab = 0;
  std::int64_t block_bytes = 1 << 20;
};

opts::Table<DataArgs> data_options(bool prepare) {
  using D = DataArgs;
  std::vector<opts::Option<D>> rows = {
      opts::custom<D>("data", "hdf5:PATH | tokens:PATH: the data file (as culprit train --data)",
                      [](D* a, const std::string& t) {
                        TrainConfig c;
                        CULPRIT_RETURN_IF_ERROR(train_options().parse_ini("data = " + t + "\n", &c, false));
                        a->data = c.data;
                        return Status::OK();
                      },
                      [](const D& a) { return a.data.text(); }, opts::kRequired),
      opts::choice<D>("token-dtype", &D::token_dtype, "tokens data: auto | uint16 | uint32 (auto: PATH.json's \"dtype\")"),
  };
  if (prepare)
    rows.push_back(opts::number<D>("vocab", &D::vocab, "tokens data: the vocabulary, when PATH.json does not say it (0: unchecked)",
                                   opts::Range<std::int64_t>{0, kMaxClasses}));
  if (!prepare)
    rows.push_back(opts::number<D>("seq-len", &D::seq_len,
                                   "tokens data: the samples' length T, which names the samples of a damaged block "
                                   "(0: PATH.json's seq_len; unknown: the block's tokens are named)",
                                   opts::Range<std::int64_t>{0, 1 << 20}));
  if (prepare)
    rows.push_back(opts::number<D>("block-bytes", &D::block_bytes,
                                   "the file's bytes are fingerprinted in blocks of this size (a changed byte names its block)",
                                   opts::Range<std::int64_t>{512, std::int64_t{1} << 30}));
  return opts::Table<D>("options", rows, /*config=*/false);
}

// The configuration that opens the data. prepare-data reads a tokens file in windows of one token
// (OpenOptions::token_window), so that every token of the file is a sample's: the record does not
// depend on the length of a run's samples.
TrainConfig open_config(const DataArgs& a) {
  TrainConfig c;
  c.data = a.data;
  c.token_dtype = a.token_dtype;
  c.gpt.vocab = a.vocab;
  c.gpt.seq_len = a.seq_len;
  if (a.data.kind == DataKind::kTokens) c.model.kind = ModelKind::kGpt;  // token ids are checked against the vocabulary
  return c;
}

Status prepare(const DataArgs& a) {
  TrainConfig cfg = open_config(a);
  DataRecord r;
  r.data = a.data.text();
  r.block_bytes = static_cast<std::uint64_t>(a.block_bytes);
  CULPRIT_RETURN_IF_ERROR(stat_file(a.data.path, &r.file_bytes, &r.mtime_ns));
  Dataset d;
  // The scan at open, with no limit but kMaxClasses (tokens: the vocabulary of --vocab or PATH.json):
  // the record says what the data holds; each run compares that with its own --classes or --vocab.
  // Always a scan: an earlier record of the file is what this one replaces.
  OpenOptions how;
  how.scan = true;
  if (a.data.kind == DataKind::kTokens) how.token_window = 1;
  CULPRIT_RETURN_IF_ERROR(load_dataset(cfg, &d, how));
  r.samples = a.data.kind == DataKind::kTokens ? d.n + 1 : d.n;
  r.max_label = d.max_label;
  r.max_label_at = d.max_label_at;
  r.max_token = d.max_token;
  r.token_bytes = d.token_bytes;
  if (a.data.kind == DataKind::kHdf5 && d.x_dtype == DType::kInt64) {
    // gpt checks x's tokens too: the largest id of x, read once more.
    cfg.model.kind = ModelKind::kGpt;
    Dataset g;
    if (load_dataset(cfg, &g, how).ok()) r.max_token = g.max_token;
  }
  CULPRIT_RETURN_IF_ERROR(each_block(a.data.path, r.block_bytes, r.file_bytes, 0, r.file_bytes,
                                     [&](std::size_t, Fingerprint fp) { r.blocks.push_back(fp); }));
  std::uint64_t bytes = 0;
  std::int64_t mtime = 0;
  CULPRIT_RETURN_IF_ERROR(stat_file(a.data.path, &bytes, &mtime));
  if (bytes != r.file_bytes || mtime != r.mtime_ns)
    return Status::IoError("data file '" + a.data.path + "' changed while it was read: run prepare-data again");
  const std::string out = record_path(a.data);
  CULPRIT_RETURN_IF_ERROR(write_data_record(out, r));
  if (a.data.kind == DataKind::kTokens)
    std::printf("prepare-data: %s: %lld tokens, %llu bytes in %zu blocks of %llu, largest token %lld\n  record: %s\n",
                r.data.c_str(), static_cast<long long>(r.samples), static_cast<unsigned long long>(r.file_bytes),
                r.blocks.size(), static_cast<unsigned long long>(r.block_bytes),
                static_cast<long long>(std::max(r.max_token, r.max_label)), out.c_str());
  else
    std::printf("prepare-data: %s: %lld samples, %llu bytes in %zu blocks of %llu, largest label %lld, largest token %lld\n"
                "  record: %s\n",
                r.data.c_str(), static_cast<long long>(d.n), static_cast<unsigned long long>(r.file_bytes), r.blocks.size(),
                static_cast<unsigned long long>(r.block_bytes), static_cast<long long>(r.max_label),
                static_cast<long long>(r.max_token), out.c_str());
  return Status::OK();
}

std::string sample_ranges(const std::vector<std::pair<std::int64_t, std::int64_t>>& runs) {
  if (runs.empty()) return "no sample (file metadata)";
  std::string s;
  for (const auto& [a, b] : runs) s += (s.empty() ? "" : ", ") + (a == b ? std::to_string(a) : std::to_string(a) + ".." + std::to_string(b));
  return "samples " + s;
}

// What the file's bytes [lo, hi) hold: an HDF5 file's samples (rows of x and y); a tokens file's
// tokens and, when the samples' length T is known, the windows of T + 1 tokens that hold them.
std::string block_holds(const DataArgs& a, Dataset& d, bool windows, std::uint64_t lo, std::uint64_t hi) {
  if (a.data.kind != DataKind::kTokens) return sample_ranges(d.reader->samples_in(lo, hi));
  const std::int64_t t = d.x_shape.at(0);
  const std::uint64_t each = d.reader->locate(0, SamplePart::kX).bytes / static_cast<std::uint64_t>(t + 1);
  const std::string tokens = "tokens " + std::to_string(lo / each) + ".." + std::to_string((hi - 1) / each);
  if (!windows) return tokens;
  const auto runs = d.reader->samples_in(lo, hi);
  if (runs.empty()) return tokens + " (after the last sample's window)";
  return sample_ranges(runs) + " (windows of " + std::to_string(t) + " tokens), " + tokens;
}

Status verify(const DataArgs& a, int* code) {
  DataRecord r;
  CULPRIT_RETURN_IF_ERROR(read_data_record(record_path(a.data), &r));
  if (!same_kind(r.data, a.data))
    return Status::BadInput("data record '" + record_path(a.data) + "' is the record of " + r.data + ", not " + a.data.text());
  std::uint64_t bytes = 0;
  std::int64_t mtime = 0;
  CULPRIT_RETURN_IF_ERROR(stat_file(a.data.path, &bytes, &mtime));
  Dataset d;
  const TrainConfig cfg = open_config(a);
  // A tokens file's samples are windows of --seq-len or PATH.json's seq_len; with neither (or a file
  // too short for one), the damaged blocks are named by their tokens.
  bool windows = true;
  Status opened = open_unscanned(cfg, &d);
  if (!opened.ok() && a.data.kind == DataKind::kTokens && a.seq_len == 0) {
    windows = false;
    opened = open_unscanned(cfg, &d, 1);
  }
  CULPRIT_RETURN_IF_ERROR(opened);
  std::size_t damaged = 0;
  CULPRIT_RETURN_IF_ERROR(each_block(a.data.path, r.block_bytes, bytes, 0, bytes, [&](std::size_t b, Fingerprint fp) {
    if (b < r.blocks.size() && r.blocks[b] == fp) return;
    const std::uint64_t lo = b * r.block_bytes, hi = std::min(bytes, lo + r.block_bytes);
    std::printf("damaged: block %zu, file offset %llu..%llu: fingerprint %s, recorded %s: %s\n", b,
                static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi), fingerprint_hex(fp).c_str(),
                b < r.blocks.size() ? fingerprint_hex(r.blocks[b]).c_str() : "none", block_holds(a, d, windows, lo, hi).c_str());
    ++damaged;
  }));
  if (bytes != r.file_bytes)
    std::printf("damaged: the file holds %llu bytes, the record %llu\n", static_cast<unsigned long long>(bytes),
                static_cast<unsigned long long>(r.file_bytes)), ++damaged;
  if (damaged) return Status::Damaged("data file '" + a.data.path + "': " + std::to_string(damaged) + " damaged block(s) since prepare-data");
  std::printf("verify-data: %s: %zu blocks match the record\n", a.data.text().c_str(), r.blocks.size());
  *code = 0;
  return Status::OK();
}

template <class Body>
cli::Command data_command(const std::string& name, const std::string& summary, bool prepare, Body body) {
  const std::string usage = "culprit " + name + " --data hdf5:PATH|tokens:PATH [options]";
  return {name, summary, [=] { return "usage: " + usage + "\n\n" + data_options(prepare).help(); },
          [=](const std::vector<std::string>& args) {
            const auto table = data_options(prepare);
            return cli::run_local<DataArgs>(args, table, usage, nullptr, [=](const DataArgs& a, int* code) {
              h5::init();
              return body(a, code);
            });
          }};
}

}  // namespace

cli::Command prepare_data_command() {
  return data_command("prepare-data", "read a data file once: record its checks and block fingerprints (PATH.culprit.json)",
                      true, [](const DataArgs& a, int*) { return prepare(a); });
}

cli::Command verify_data_command() {
  return data_command("verify-data", "compare a data file with its record: the blocks that changed and their samples", false,
                      [](const DataArgs& a, int* code) { return verify(a, code); });
}

}  // namespace culprit::harness
