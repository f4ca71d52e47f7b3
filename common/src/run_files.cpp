// Writing inside a run directory without following links, without half-written files, with the
// OS's reason in every error (run_files.h).
#include "culprit/run_files.h"

#include "culprit/fingerprint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/sysmacros.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <random>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

namespace culprit::files {

namespace fs = std::filesystem;

namespace {

Status os_error(const std::string& what, const std::string& path, int err) {
  return Status::IoError("cannot " + what + " '" + path + "': " + std::strerror(err));
}

Status link_refused(const std::string& path) {
  return Status::BadInput("'" + path + "' is a symbolic link: culprit does not follow links inside a run directory "
                          "(remove it)");
}

// open(2) with O_NOFOLLOW: ELOOP means the last component is a link.
Status open_nofollow(const std::string& path, int flags, int* fd, mode_t mode = 0644) {
  *fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  if (*fd >= 0) return Status::OK();
  if (errno == ELOOP) return link_refused(path);
  return os_error("open", path, errno);
}

Status write_all(int fd, const std::string& text, const std::string& path) {
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return os_error("write", path, errno);
    done += static_cast<std::size_t>(n);
  }
  return Status::OK();
}

// write + fsync + close, closing in every case.
Status finish(int fd, const std::string& text, const std::string& path) {
  Status st = write_all(fd, text, path);
  if (st.ok() && ::fsync(fd) != 0) st = os_error("sync", path, errno);
  if (::close(fd) != 0 && st.ok()) st = os_error("write", path, errno);
  return st;
}

Status sync_dir(const std::string& path) {
  const std::string dir = fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return os_error("sync the directory", dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  return rc == 0 ? Status::OK() : os_error("sync the directory", dir, err);
}

std::string host_name() {
  char h[256] = {0};
  ::gethostname(h, sizeof h - 1);
  return h;
}

std::string utc_now() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

Status refuse_link(const std::string& path) {
  struct stat s{};
  if (::lstat(path.c_str(), &s) != 0) return errno == ENOENT ? Status::OK() : os_error("inspect", path, errno);
  return S_ISLNK(s.st_mode) ? link_refused(path) : Status::OK();
}

Status ensure_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return Status::OK();
  if (errno != EEXIST) return os_error("create the directory", path, errno);
  struct stat s{};
  if (::lstat(path.c_str(), &s) != 0) return os_error("inspect", path, errno);
  if (S_ISLNK(s.st_mode)) return link_refused(path);
  if (!S_ISDIR(s.st_mode)) return Status::BadInput("'" + path + "' is not a directory");
  return Status::OK();
}

Status open_append(const std::string& path, int* fd) {
  return open_nofollow(path, O_RDWR | O_APPEND | O_CREAT, fd);  // read: append() looks at the last byte
}

Status append(const std::string& path, const std::string& text) {
  int fd = -1;
  CULPRIT_RETURN_IF_ERROR(open_append(path, &fd));
  // A torn last line (a crash or a full disk mid-append) is cut first: a record glued onto it
  // would make both unreadable (culprit log may append before any --resume).
  struct stat s{};
  char last = '\n';
  if (::fstat(fd, &s) == 0 && s.st_size > 0 && ::pread(fd, &last, 1, s.st_size - 1) == 1 && last != '\n') {
    ::close(fd);
    CULPRIT_RETURN_IF_ERROR(cut_torn_tail(path));
    CULPRIT_RETURN_IF_ERROR(open_append(path, &fd));
  }
  return finish(fd, text, path);
}

Status create_fresh(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return os_error("replace", path, errno);
  int fd = -1;
  CULPRIT_RETURN_IF_ERROR(open_nofollow(path, O_WRONLY | O_CREAT | O_EXCL, &fd));
  if (::close(fd) != 0) return os_error("create", path, errno);
  return Status::OK();
}

Status write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  Status st = create_fresh(tmp);
  int fd = -1;
  if (st.ok()) st = open_nofollow(tmp, O_WRONLY | O_TRUNC, &fd);
  if (st.ok()) st = finish(fd, text, tmp);
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) st = os_error("rename '" + tmp + "' to", path, errno);
  if (!st.ok()) {
    ::unlink(tmp.c_str());  // never a half-written file left behind
    return st;
  }
  return sync_dir(path);
}

Status cut_torn_tail(const std::string& path) {
  CULPRIT_RETURN_IF_ERROR(refuse_link(path));
  int fd = -1;
  std::uint64_t size = 0;
  // Appended files grow with the run: no size limit here (only the last line is looked at).
  CULPRIT_RETURN_IF_ERROR(open_regular(path, UINT64_MAX, "record lines", &fd, &size));
  if (fd < 0) return Status::OK();
  // Whole when it ends with a newline; otherwise the last newline is searched backwards a block at
  // a time: the file is never read whole.
  char last = '\n';
  if (size > 0 && ::pread(fd, &last, 1, static_cast<off_t>(size - 1)) != 1) {
    const int err = errno;
    ::close(fd);
    return os_error("read", path, err);
  }
  if (last == '\n') {
    ::close(fd);
    return Status::OK();
  }
  std::uint64_t end = size - 1, keep = 0;
  bool found = false;
  char block[65536];
  while (end > 0 && !found) {
    const std::uint64_t from = end > sizeof block ? end - sizeof block : 0;
    const ssize_t n = ::pread(fd, block, static_cast<std::size_t>(end - from), static_cast<off_t>(from));
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      return os_error("read", path, err);
    }
    for (ssize_t i = n; i-- > 0;)
      if (block[i] == '\n') {
        found = true;
        keep = from + static_cast<std::uint64_t>(i) + 1;
        break;
      }
    end = from;
  }
  ::close(fd);
  return keep_prefix(path, found ? keep : 0);
}

Status open_regular(const std::string& path, std::uint64_t max_bytes, const char* what, int* fd,
                    std::uint64_t* size) {
  *fd = -1;
  // O_NONBLOCK: opening a fifo for reading would otherwise wait for a writer, forever.
  const int f = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (f < 0) return errno == ENOENT ? Status::OK() : os_error("read", path, errno);
  struct stat s{};
  if (::fstat(f, &s) != 0) {
    const int err = errno;
    ::close(f);
    return os_error("inspect", path, err);
  }
  if (!S_ISREG(s.st_mode)) {
    ::close(f);
    const char* kind = S_ISDIR(s.st_mode) ? "a directory" : S_ISFIFO(s.st_mode) ? "a fifo" : S_ISSOCK(s.st_mode) ? "a socket"
                       : S_ISCHR(s.st_mode) || S_ISBLK(s.st_mode) ? "a device" : "not a file";
    return Status::Damaged("'" + path + "' is " + kind + ", not a regular file: it cannot hold " + what +
                           " (remove it, or put the run's own file back)");
  }
  const auto bytes = static_cast<std::uint64_t>(s.st_size);
  if (bytes > max_bytes) {
    ::close(f);
    return Status::Damaged("'" + path + "' is " + std::to_string(bytes) + " bytes, more than " + what + " can be (" +
                           std::to_string(max_bytes >> 20) + " MiB): not a culprit record (remove it, or put the "
                           "run's own file back)");
  }
  // Reads block from here on (a regular file never waits, but the flag is cleared all the same).
  ::fcntl(f, F_SETFL, ::fcntl(f, F_GETFL) & ~O_NONBLOCK);
  *fd = f;
  if (size) *size = bytes;
  return Status::OK();
}

Status read_regular(const std::string& path, std::uint64_t max_bytes, const char* what, std::string* out,
                    bool* absent) {
  out->clear();
  int fd = -1;
  std::uint64_t size = 0;
  CULPRIT_RETURN_IF_ERROR(open_regular(path, max_bytes, what, &fd, &size));
  if (absent) *absent = fd < 0;
  if (fd < 0) return absent ? Status::OK() : Status::BadInput("'" + path + "' does not exist");
  out->resize(static_cast<std::size_t>(size));
  std::size_t done = 0;
  while (done < out->size()) {
    const ssize_t n = ::read(fd, &(*out)[done], out->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return os_error("read", path, err);
    }
    if (n == 0) break;  // shorter than fstat said (being cut): what is there
    done += static_cast<std::size_t>(n);
  }
  out->resize(done);
  ::close(fd);
  return Status::OK();
}

LineReader::LineReader(int fd, std::string path, std::size_t max_line)
    : fd_(fd), path_(std::move(path)), max_line_(max_line) {}
LineReader::~LineReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool LineReader::next(std::string* line, bool* whole) {
  if (!status_.ok() || fd_ < 0) return false;
  for (;;) {
    const std::size_t nl = buf_.find('\n', at_);
    if (nl != std::string::npos || (eof_ && at_ < buf_.size())) {
      const std::size_t end = nl == std::string::npos ? buf_.size() : nl;
      if (end - at_ > max_line_) break;
      line->assign(buf_, at_, end - at_);
      *whole = nl != std::string::npos;
      start_ = consumed_;
      consumed_ += end - at_ + (*whole ? 1 : 0);
      at_ = *whole ? end + 1 : end;
      ++lineno_;
      return true;
    }
    if (eof_) return false;
    if (buf_.size() - at_ > max_line_) break;
    buf_.erase(0, at_);
    at_ = 0;
    char chunk[65536];
    const ssize_t n = ::read(fd_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status_ = os_error("read", path_, errno);
      return false;
    }
    if (n == 0) eof_ = true;
    buf_.append(chunk, static_cast<std::size_t>(n));
  }
  status_ = Status::Damaged("'" + path_ + "' line " + std::to_string(lineno_ + 1) + " is longer than " +
                            std::to_string(max_line_) + " bytes: not a culprit record");
  return false;
}

Status keep_prefix(const std::string& path, std::uint64_t length) {
  int in = -1;
  CULPRIT_RETURN_IF_ERROR(open_regular(path, UINT64_MAX, "record lines", &in));
  if (in < 0) return Status::OK();
  const std::string tmp = path + ".tmp";
  Status st = create_fresh(tmp);
  int out = -1;
  if (st.ok()) st = open_nofollow(tmp, O_WRONLY | O_TRUNC, &out);
  char block[65536];
  for (std::uint64_t done = 0; st.ok() && done < length;) {
    const ssize_t n = ::read(in, block, static_cast<std::size_t>(std::min<std::uint64_t>(sizeof block, length - done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      st = n < 0 ? os_error("read", path, errno) : Status::IoError("'" + path + "' became shorter while being cut");
      break;
    }
    st = write_all(out, std::string(block, static_cast<std::size_t>(n)), tmp);
    done += static_cast<std::uint64_t>(n);
  }
  ::close(in);
  if (out >= 0) {
    if (st.ok() && ::fsync(out) != 0) st = os_error("sync", tmp, errno);
    if (::close(out) != 0 && st.ok()) st = os_error("write", tmp, errno);
  }
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) st = os_error("rename '" + tmp + "' to", path, errno);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  return sync_dir(path);
}

Status remove(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return Status::OK();
  return os_error("delete", path, errno);
}

Status remove_durably(const std::string& path) {
  if (::unlink(path.c_str()) == 0) return sync_dir(path);
  if (errno == ENOENT) return Status::OK();
  return os_error("delete", path, errno);
}

Status move(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) return os_error("rename '" + from + "' to", to, errno);
  return sync_dir(to);
}

Status free_bytes(const std::string& path, std::uint64_t* out) {
  struct statvfs v{};
  if (::statvfs(path.c_str(), &v) != 0) return os_error("inspect the filesystem of", path, errno);
  *out = static_cast<std::uint64_t>(v.f_bavail) * v.f_frsize;
  return Status::OK();
}

Status same_run(const std::string& file, const std::string& theirs, const std::string& ours) {
  if (theirs.empty() || ours.empty() || theirs == ours) return Status::OK();
  // Found in a run directory, another run's file is damage to this run (exit 4 from every command,
  // as verify says); one the user names (--resume-from) is bad input, which that caller says.
  return Status::Damaged("'" + file + "' belongs to another run (run_id " + printable(theirs) + "; this run is " +
                          ours + "): a foreign file in a run directory is never used");
}

std::string new_run_id() {
  std::random_device rd;
  const std::string seed = host_name() + "/" + std::to_string(::getpid()) + "/" +
                           std::to_string(std::chrono::system_clock::now().time_since_epoch().count()) + "/" +
                           std::to_string(rd()) + std::to_string(rd());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fingerprint_bytes(seed.data(), seed.size())));
  return hex;
}

const char* const* owned_names() {
  static const char* const names[] = {"run.json",       "metrics.jsonl", "checkpoints",   "checkpoints.jsonl",
                                      "trace",          "incidents.jsonl", "incidents.log", "diagnosis.json",
                                      "diagnosis.html", "audit.json",    "audit",         nullptr};
  return names;
}

namespace {

// The pid a .lock line names ("culprit train (host H, pid P, ...)"), when it names this host.
long pid_on_this_host(const std::string& who) {
  const std::string host = "(host " + host_name() + ", pid ";
  const auto at = who.find(host);
  if (at == std::string::npos) return -1;
  return std::strtol(who.c_str() + at + host.size(), nullptr, 10);
}

bool alive(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// The processes of this host holding a flock on the file (device, inode), from /proc/locks
// ("1: FLOCK  ADVISORY  WRITE 4711 08:02:1234 0 EOF"); none where the kernel does not say (NFS).
std::vector<long> flock_holders(const struct stat& s) {
  std::vector<long> out;
  std::ifstream locks("/proc/locks");
  char want[64];
  std::snprintf(want, sizeof want, "%02x:%02x:%llu", major(s.st_dev), minor(s.st_dev),
                static_cast<unsigned long long>(s.st_ino));
  for (std::string line; std::getline(locks, line);) {
    std::istringstream f(line);
    std::string id, kind, adv, mode, where;
    long pid = 0;
    if (!(f >> id >> kind)) continue;
    if (kind == "->") f >> kind;  // a waiter
    if (kind != "FLOCK" || !(f >> adv >> mode >> pid >> where)) continue;
    if (where == want && alive(pid) && pid != ::getpid()) out.push_back(pid);
  }
  return out;
}

std::string command_line(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (auto& c : all)
    if (c == '\0') c = ' ';
  while (!all.empty() && all.back() == ' ') all.pop_back();
  return all.size() > 120 ? all.substr(0, 117) + "..." : all;
}

// Who holds the lock on `fd` (which this process failed to take): the line the holder wrote, read
// again for a moment when it names a process of this host that has ended (the holder takes the
// lock, then writes its line: a refusal in between reads its predecessor's); then the kernel's
// word for who holds it.
std::string lock_holder(int fd) {
  std::string who;
  for (int attempt = 0; attempt < 20; ++attempt) {
    char buf[512] = {0};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    who = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    const long pid = pid_on_this_host(who);
    if (!who.empty() && (pid < 0 || alive(pid))) return printable(who);
    ::usleep(50 * 1000);
  }
  struct stat s{};
  std::vector<long> pids;
  if (::fstat(fd, &s) == 0) pids = flock_holders(s);
  std::string live;
  for (long p : pids) live += (live.empty() ? "" : "; ") + std::string("pid ") + std::to_string(p) + " (" + printable(command_line(p)) + ")";
  if (!live.empty())
    return "another process on this host: " + live + (who.empty() ? "" : " (the lock file still names " + printable(who) + ", which has ended)");
  return who.empty() ? std::string("another process") : "another process (the lock file names " + printable(who) + ", which has ended)";
}

Status in_use(const std::string& run_dir, int fd, const char* advice) {
  return Status::BadInput("run directory '" + run_dir + "' is in use by " + lock_holder(fd) + ": " + advice);
}

// The locks this process holds, by the run directory's identity: descriptor and mode. Never
// closed (the kernel releases the locks at exit).
std::mutex& locks_mu() {
  static std::mutex mu;
  return mu;
}
std::map<std::pair<dev_t, ino_t>, std::pair<int, Lock>>& held_locks() {
  static std::map<std::pair<dev_t, ino_t>, std::pair<int, Lock>> held;
  return held;
}

}  // namespace

Status lock_run_dir(const std::string& run_dir, const std::string& command, Lock mode) {
  // Held for the life of the process, keyed by the directory's identity, not its spelling.
  auto& held = held_locks();
  struct stat d{};
  if (::stat(run_dir.c_str(), &d) != 0) return os_error("open the run directory", run_dir, errno);
  std::lock_guard<std::mutex> guard(locks_mu());
  const auto it = held.find({d.st_dev, d.st_ino});
  if (it != held.end() && (it->second.second == Lock::kExclusive || mode == Lock::kShared)) return Status::OK();
  if (it != held.end()) {  // held shared, wanted exclusive: convert
    if (::flock(it->second.first, LOCK_EX | LOCK_NB) == 0) {
      it->second.second = Lock::kExclusive;
      return Status::OK();
    }
    // A failed conversion may have dropped the shared lock (flock(2): not atomic): take it back
    // (another shared holder is why it failed, so nobody can hold it exclusively), then say who.
    ::flock(it->second.first, LOCK_SH | LOCK_NB);
  }
  const std::string path = (fs::path(run_dir) / ".lock").string();
  int fd = -1;
  // Owner-only: whoever can open the file can flock it, and so keep the run's owner out of it.
  const Status opened = open_nofollow(path, O_RDWR | O_CREAT, &fd, 0600);
  const int open_err = errno;
  if (!opened.ok() && (open_err == EROFS || open_err == EACCES || open_err == EPERM))
    // A read-only run (an archive, a read-only mount, another user's run): the commands that take
    // the lock write into the run (train its records, bisect its diagnosis, audit its report), so
    // there is nothing to do here but say where they can run.
    return Status::IoError(opened.message() + ": culprit " + command + " writes into the run directory (its lock and "
                           "its records), which is read-only here; copy the run to a writable place (cp -a '" +
                           run_dir + "' COPY) and run it on the copy");
  CULPRIT_RETURN_IF_ERROR(opened);
  // A .lock made before (0644) is narrowed too; one of another owner is left as it is.
  struct stat ls{};
  if (::fstat(fd, &ls) == 0 && ls.st_uid == ::geteuid() && (ls.st_mode & 077) != 0) ::fchmod(fd, 0600);
  if (::flock(fd, (mode == Lock::kShared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
    const int err = errno;
    if (err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK) {
      ::close(fd);
      // A filesystem without flock (Lustre mounted without -o flock, some NFS setups): the run
      // goes on unguarded, and says so once.
      std::fprintf(stderr, "culprit: warning: the filesystem of '%s' does not support flock (%s): running without "
                   "the run-directory lock (docs/architecture.md)\n", run_dir.c_str(), std::strerror(err));
      return Status::OK();
    }
    if (err != EWOULDBLOCK) {
      ::close(fd);
      return os_error("lock", path, err);
    }
    const Status st = in_use(run_dir, fd, "one job writes a run at a time (wait for it, or choose another --run-dir)");
    ::close(fd);
    return st;
  }
  const char* job = std::getenv("SLURM_JOB_ID");
  const std::string who = "culprit " + command + " (host " + host_name() + ", pid " + std::to_string(::getpid()) +
                          (job ? std::string(", Slurm job ") + job : std::string()) + ", since " + utc_now() + ")\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) < 0) {
    const int err = errno;
    ::close(fd);
    return os_error("write", path, err);
  }
  held[{d.st_dev, d.st_ino}] = {fd, mode};
  return Status::OK();
}

Status check_not_in_use(const std::string& run_dir, const std::string& command) {
  struct stat d{};
  if (::stat(run_dir.c_str(), &d) != 0)  // no such run: the command's own reading says so
    return errno == ENOENT || errno == ENOTDIR ? Status::OK() : os_error("open the run directory", run_dir, errno);
  {
    std::lock_guard<std::mutex> guard(locks_mu());
    if (held_locks().count({d.st_dev, d.st_ino})) return Status::OK();  // this process writes it
  }
  const std::string path = (fs::path(run_dir) / ".lock").string();
  CULPRIT_RETURN_IF_ERROR(refuse_link(path));
  // Read-only: nothing is created, and the lock file is not rewritten (the holder's line stays).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::OK();  // no .lock, or not ours to open: nobody we could ask
  struct stat s{};
  if (::fstat(fd, &s) != 0 || !S_ISREG(s.st_mode)) {
    ::close(fd);
    return Status::OK();
  }
  if (::flock(fd, LOCK_SH | LOCK_NB) == 0) return Status::OK();  // held (shared) until the process ends
  const int err = errno;
  const std::string advice = command + " reads a run no job is writing (wait for the job to end; a file of it can be "
                             "checked alone: culprit verify FILE)";
  const Status st = err == EWOULDBLOCK ? in_use(run_dir, fd, advice.c_str()) : Status::OK();
  ::close(fd);
  return st;
}

}  // namespace culprit::files
