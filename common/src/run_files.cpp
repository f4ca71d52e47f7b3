// Writing inside a run directory without following links, without half-written files, with the
// OS's reason in every error (run_files.h).
#include "culprit/run_files.h"

#include "culprit/fingerprint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
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
Status open_nofollow(const std::string& path, int flags, int* fd) {
  *fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, 0644);
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
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::OK();
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.empty() || all.back() == '\n') return Status::OK();
  const std::size_t keep = all.rfind('\n');
  return write_atomic(path, keep == std::string::npos ? std::string() : all.substr(0, keep + 1));
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
  return Status::BadInput("'" + file + "' belongs to another run (run_id " + printable(theirs) + "; this run is " +
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

Status lock_run_dir(const std::string& run_dir, const std::string& command, Lock mode) {
  // Held for the life of the process: the descriptors are never closed (the kernel releases the
  // locks at exit). Keyed by the directory's identity, not its spelling.
  static std::mutex mu;
  static std::map<std::pair<dev_t, ino_t>, std::pair<int, Lock>> held;  // descriptor, mode
  struct stat d{};
  if (::stat(run_dir.c_str(), &d) != 0) return os_error("open the run directory", run_dir, errno);
  std::lock_guard<std::mutex> guard(mu);
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
  CULPRIT_RETURN_IF_ERROR(open_nofollow(path, O_RDWR | O_CREAT, &fd));
  if (::flock(fd, (mode == Lock::kShared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
    const int err = errno;
    char buf[512] = {0};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    if (err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK) {
      // A filesystem without flock (Lustre mounted without -o flock, some NFS setups): the run
      // goes on unguarded, and says so once.
      std::fprintf(stderr, "culprit: warning: the filesystem of '%s' does not support flock (%s): running without "
                   "the run-directory lock (docs/architecture.md)\n", run_dir.c_str(), std::strerror(err));
      return Status::OK();
    }
    if (err != EWOULDBLOCK) return os_error("lock", path, err);
    std::string who = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("another process");
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    return Status::BadInput("run directory '" + run_dir + "' is in use by " + printable(who) +
                            ": one job writes a run at a time (wait for it, or choose another --run-dir)");
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

}  // namespace culprit::files
