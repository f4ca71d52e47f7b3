// tokens:PATH — a flat binary file of uint16 or uint32 token ids (little-endian, no header: the
// layout nanoGPT's prepare scripts and Megatron's .bin files use), memory mapped. Sample i is the
// window of T + 1 tokens starting at token i*T (T = --seq-len): x its first T, y its last T (the next
// token of each). Dtype, vocabulary and T come from the options or PATH.json (docs/data.md).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "culprit/data.h"

namespace culprit::harness {

namespace {

// PATH.json, written by whatever tokenised the corpus (scripts/tokenize.py writes one): the token
// dtype, the vocabulary size and, optionally, the sequence length. Options given win; a value given
// both ways must agree.
struct TokenMeta {
  std::string dtype;
  std::int64_t vocab = 0, seq_len = 0;
};

Status read_meta(const std::string& path, TokenMeta* m) {
  const std::string side = path + ".json";
  std::ifstream in(side);
  if (!in) return Status::OK();  // no sidecar: the options must say it all
  nlohmann::json j;
  try {
    in >> j;
    if (!j.is_object()) throw std::runtime_error("not a JSON object");
    if (j.contains("dtype")) m->dtype = j.at("dtype").get<std::string>();
    if (j.contains("vocab")) m->vocab = j.at("vocab").get<std::int64_t>();
    if (j.contains("seq_len")) m->seq_len = j.at("seq_len").get<std::int64_t>();
  } catch (const std::exception& e) {
    return Status::BadInput("token data sidecar '" + side + "': " + e.what());
  }
  if (m->vocab < 0 || m->vocab > kMaxClasses || m->seq_len < 0 || m->seq_len > (1 << 20))
    return Status::BadInput("token data sidecar '" + side + "': vocab must be in [1, " + std::to_string(kMaxClasses) +
                            "] and seq_len in [1, 1048576]");
  return Status::OK();
}

std::string to_text(const std::string& s) { return s; }
std::string to_text(std::int64_t v) { return std::to_string(v); }

// The value an option gives, else the sidecar's; both given must agree.
template <class T>
Status pick(const std::string& path, const char* option, const char* key, T given, T stored, T unset, T* out) {
  if (given != unset && stored != unset && given != stored)
    return Status::BadInput("data 'tokens:" + path + "': option '--" + option + "' is " + to_text(given) + " but " + path +
                            ".json says " + key + " " + to_text(stored));
  *out = given != unset ? given : stored;
  return Status::OK();
}

class TokenSource : public DataSource {
 public:
  TokenSource(std::string path, int fd, const void* map, std::size_t size, std::size_t token_bytes, std::int64_t t)
      : path_(std::move(path)), fd_(fd), map_(static_cast<const unsigned char*>(map)), size_(size), each_(token_bytes), t_(t) {}
  ~TokenSource() override {
    if (map_) ::munmap(const_cast<unsigned char*>(map_), size_);
    ::close(fd_);
  }

  Status read(const std::int64_t* idx, std::size_t count, unsigned char* x, unsigned char* y) override {
    // A mapped page past the end of a file that shrank raises SIGBUS, which would kill the rank and
    // read as a silent rank (hardware): the size is checked first (a shrink after this check, within
    // the read, still can: a file must not be truncated under a running job).
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && static_cast<std::uint64_t>(st.st_size) < size_)
      return Status::IoError("data 'tokens:" + path_ + "' shrank to " + std::to_string(st.st_size) + " bytes from " +
                             std::to_string(size_) + " while the run reads it");
    auto* xs = reinterpret_cast<std::int64_t*>(x);
    auto* ys = reinterpret_cast<std::int64_t*>(y);
    // The bytes read and not yet released: windows that meet or touch merge, so the scan at open
    // (consecutive windows) releases once per call, not once per window (prepare-data's windows of
    // one token made that a syscall per token: minutes for 100 MB).
    std::size_t lo = 0, hi = 0;
    prefetch(idx, count);
    for (std::size_t r = 0; r < count; ++r) {
      const std::size_t first = static_cast<std::size_t>(idx[r]) * static_cast<std::size_t>(t_);
      for (std::int64_t j = 0; j <= t_; ++j) {
        const std::int64_t tok = token(first + static_cast<std::size_t>(j));
        if (j < t_) xs[r * t_ + j] = tok;
        if (j > 0) ys[r * t_ + j - 1] = tok;
      }
      const std::size_t a = first * each_, b = (first + static_cast<std::size_t>(t_) + 1) * each_;
      if (hi > lo && (a > hi || b < lo)) {
        release(lo, hi);
        hi = lo;
      }
      if (hi > lo) {
        lo = std::min(lo, a);
        hi = std::max(hi, b);
      } else {
        lo = a;
        hi = b;
      }
    }
    if (hi > lo) release(lo, hi);
    return Status::OK();
  }

  // The largest of the tokens [from, to) below `limit` (-1: none), their pages released after.
  std::int64_t largest(std::size_t from, std::size_t to, std::int64_t limit) {
    std::int64_t m = -1;
    for (std::size_t k = from; k < to; ++k)
      if (token(k) < limit) m = std::max(m, token(k));
    if (to > from) release(from * each_, to * each_);
    return m;
  }

  SampleLocation locate(std::int64_t i, SamplePart) override {
    SampleLocation loc;
    loc.file = path_;
    loc.offset = static_cast<std::uint64_t>(i) * static_cast<std::uint64_t>(t_) * each_;
    loc.bytes = static_cast<std::uint64_t>(t_ + 1) * each_;
    loc.detail = "tokens " + std::to_string(i * t_) + ".." + std::to_string(i * t_ + t_);
    return loc;
  }

  // Window i covers tokens [i*T, i*T + T]: neighbouring windows share one token.
  std::vector<std::pair<std::int64_t, std::int64_t>> samples_in(std::uint64_t lo, std::uint64_t hi) override {
    if (hi <= lo) return {};
    const std::int64_t n = static_cast<std::int64_t>((size_ / each_ - 1) / static_cast<std::size_t>(t_));
    const auto first_tok = static_cast<std::int64_t>(lo / each_), last_tok = static_cast<std::int64_t>((hi - 1) / each_);
    std::int64_t first = first_tok / t_;
    if (first_tok % t_ == 0 && first_tok > 0) first -= 1;  // the previous window's last token
    const std::int64_t last = std::min(n - 1, last_tok / t_);
    if (first > last) return {};
    return {{first, last}};
  }

 private:
  // Token k of the file.
  std::int64_t token(std::size_t k) const {
    const unsigned char* p = map_ + k * each_;
    if (each_ == 2) return static_cast<std::int64_t>(p[0] | p[1] << 8);
    return static_cast<std::int64_t>(static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
                                     static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24);
  }

  // Windows are read in the epoch's order (MADV_RANDOM: a fault reads its page only), but the scan
  // at open reads consecutive windows, a few MiB a call: asked for at once, they come in large reads
  // (a cold 100 MB file: 3.5 s page by page).
  void prefetch(const std::int64_t* idx, std::size_t count) {
    if (count < 2 || idx[count - 1] - idx[0] != static_cast<std::int64_t>(count) - 1) return;
    for (std::size_t r = 1; r < count; ++r)
      if (idx[r] != idx[r - 1] + 1) return;
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t lo = static_cast<std::size_t>(idx[0]) * static_cast<std::size_t>(t_) * each_ / page * page;
    const std::size_t hi = std::min(size_, (static_cast<std::size_t>(idx[count - 1]) + 1) * static_cast<std::size_t>(t_) * each_ + each_);
    if (hi > lo) ::madvise(const_cast<unsigned char*>(map_) + lo, hi - lo, MADV_WILLNEED);
  }

  // The pages of the file's bytes [lo, hi) leave this process once copied: a mapped page that was
  // read stays in the process's resident set (RssFile) until the kernel reclaims it, so without this
  // a pass over a file larger than memory would show as the process growing. The page cache keeps
  // them. A read fault also maps the neighbours that are in the page cache already, within its
  // aligned block of fault_around_bytes (64 KiB by default; MADV_RANDOM does not stop it): pages
  // another rank or an earlier window brought in. Released only page by page, those stayed and the
  // process grew with every window read (RssFile +7 MiB in 100 steps, bench/stream.py), so the
  // release covers the aligned blocks around the bytes read: 2 MiB, the most fault_around_bytes
  // can be (one page table's span) and the size of a large folio the kernel may map whole with one
  // fault (clearing the absent entries of a block costs a few microseconds).
  void release(std::size_t lo, std::size_t hi) {
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t block = std::max<std::size_t>(page, kFaultAround);
    lo = lo / block * block;
    hi = std::min(size_, (hi + block - 1) / block * block);
    if (hi > lo) ::madvise(const_cast<unsigned char*>(map_) + lo, hi - lo, MADV_DONTNEED);
  }
  static constexpr std::size_t kFaultAround = 2 << 20;

  std::string path_;
  int fd_;
  const unsigned char* map_;
  std::size_t size_, each_;
  std::int64_t t_;
};

}  // namespace

Status open_tokens(const TrainConfig& cfg, const std::string& path, Dataset* d, std::int64_t window) {
  d->source = "tokens:" + path;
  const std::string what = "data 'tokens:" + path + "'";
  TokenMeta meta;
  CULPRIT_RETURN_IF_ERROR(read_meta(path, &meta));
  std::string dtype;
  std::int64_t seq_len = 0, vocab = 0;
  CULPRIT_RETURN_IF_ERROR(pick<std::string>(path, "token-dtype", "dtype", cfg.token_dtype == TokenDType::kAuto ? std::string() : name_of(cfg.token_dtype), meta.dtype, "", &dtype));
  if (window > 0)
    seq_len = window;  // prepare-data and verify-data: windows of their own, the run's length aside
  else
    CULPRIT_RETURN_IF_ERROR(pick<std::int64_t>(path, "seq-len", "seq_len", cfg.gpt.seq_len, meta.seq_len, 0, &seq_len));
  CULPRIT_RETURN_IF_ERROR(pick<std::int64_t>(path, "vocab", "vocab", cfg.gpt.vocab, meta.vocab, 0, &vocab));
  if (dtype.empty())
    return Status::BadInput(what + ": the token dtype is not known: give --token-dtype uint16|uint32 or write it in " + path + ".json");
  if (dtype != "uint16" && dtype != "uint32")
    return Status::BadInput(what + ": token dtype '" + dtype + "' is not uint16 or uint32");
  if (seq_len <= 0)
    return Status::BadInput(what + ": the sequence length is not known: give --seq-len T or write seq_len in " + path + ".json");
  const std::size_t each = dtype == "uint16" ? 2 : 4;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::BadInput(what + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::BadInput(what + ": not a regular file");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  Status bad;
  if (size % each != 0)
    bad = Status::BadInput(what + ": its " + std::to_string(size) + " bytes are not a whole number of " + dtype +
                           " token ids (" + std::to_string(each) + " bytes each)");
  else if (size / each < static_cast<std::uint64_t>(seq_len) + 1)
    bad = Status::BadInput(what + " holds " + std::to_string(size / each) + " tokens: too few for one sample of --seq-len " +
                           std::to_string(seq_len) + " (" + std::to_string(seq_len + 1) + " tokens)");
  void* map = bad.ok() ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int map_errno = errno;
  if (!bad.ok() || map == MAP_FAILED) ::close(fd);  // else the source keeps it, to see the file shrink
  if (!bad.ok()) return bad;
  if (map == MAP_FAILED) return Status::IoError(what + ": cannot map the file: " + std::strerror(map_errno));
  ::madvise(map, size, MADV_RANDOM);  // windows are read in the epoch's order: no read-around
  const std::uint64_t tokens = size / each;
  d->n = static_cast<std::int64_t>((tokens - 1) / static_cast<std::uint64_t>(seq_len));
  d->x_dtype = d->y_dtype = DType::kInt64;
  d->x_shape = d->y_shape = {seq_len};
  d->classes = vocab;  // 0: the scan finds the largest token
  d->token_bytes = static_cast<int>(each);
  auto source = std::make_shared<TokenSource>(path, fd, map, size, each, seq_len);
  // The tokens after the last window are in no sample, but without a vocabulary the model's width is
  // the largest token + 1, found by the scan at open or read from a data record — and the record
  // reads every token of the file, whatever T. The scan starts from these, so that both give the
  // same width (the same bits with and without a record).
  d->max_token = source->largest(static_cast<std::size_t>(d->n * seq_len) + 1, static_cast<std::size_t>(tokens),
                                 vocab > 0 ? vocab : kMaxClasses);
  d->reader = std::move(source);
  return Status::OK();
}

}  // namespace culprit::harness
