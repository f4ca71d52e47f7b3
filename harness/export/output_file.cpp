#include "export/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace culprit::harness {

namespace fs = std::filesystem;

namespace {

Status os_error(const std::string& what, const std::string& path, int err) {
  return Status::IoError("cannot " + what + " '" + path + "': " + std::strerror(err));
}

Status exists_error(const std::string& path) {
  return Status::BadInput("'" + path + "' exists: give --force to replace it");
}

std::string dir_of(const std::string& path) {
  const std::string d = fs::path(path).parent_path().string();
  return d.empty() ? "." : d;
}

Status write_all(int fd, const std::string& bytes, const std::string& path) {
  for (std::size_t at = 0; at < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return os_error("write", path, errno);
    at += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) return os_error("sync", path, errno);
  return Status::OK();
}

// The temporary, made fresh (O_EXCL, no link followed) in the target's directory: the rename that
// commits it stays on one filesystem. A leftover of a killed process with the same pid is replaced.
Status make_temp(const std::string& tmp, const std::string& path, int* fd) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    *fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (*fd >= 0) return Status::OK();
    if (errno != EEXIST || attempt) break;
    ::unlink(tmp.c_str());
  }
  return Status::IoError("cannot write '" + path + "': " + std::strerror(errno) + " (creating its temporary '" + tmp +
                         "')");
}

// Moves tmp to path unless path exists, atomically: renameat2's RENAME_NOREPLACE, or where the
// filesystem lacks it, a hard link (which fails on an existing name) and the temporary's unlink.
Status commit_new(const std::string& tmp, const std::string& path) {
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return Status::OK();
  if (errno == EEXIST) return exists_error(path);
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return os_error("rename '" + tmp + "' to", path, errno);
  if (::link(tmp.c_str(), path.c_str()) != 0)
    return errno == EEXIST ? exists_error(path) : os_error("link '" + tmp + "' to", path, errno);
  ::unlink(tmp.c_str());
  return Status::OK();
}

Status sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return os_error("open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems cannot sync a directory (EINVAL): the rename is still done.
  return rc != 0 && err != EINVAL ? os_error("sync directory", dir, err) : Status::OK();
}

}  // namespace

Status check_output(const std::string& path, bool replace) {
  if (path.empty()) return Status::BadInput("option '--out' is empty");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return Status::OK();  // absent, or unreachable: write_output says why
  if (S_ISDIR(st.st_mode)) return Status::BadInput("'" + path + "' is a directory: --out names the file to write");
  return replace ? Status::OK() : exists_error(path);
}

Status write_output(const std::string& path, const std::string& bytes, bool replace) {
  const std::string tmp =
      (fs::path(dir_of(path)) / ("." + fs::path(path).filename().string() + "." + std::to_string(::getpid()) + ".tmp"))
          .string();
  int fd = -1;
  CULPRIT_RETURN_IF_ERROR(make_temp(tmp, path, &fd));
  Status st = write_all(fd, bytes, tmp);
  if (::close(fd) != 0 && st.ok()) st = os_error("write", tmp, errno);
  if (st.ok()) {
    if (!replace) st = commit_new(tmp, path);
    else if (std::rename(tmp.c_str(), path.c_str()) != 0) st = os_error("rename '" + tmp + "' to", path, errno);
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());  // never a half-written file left behind
    return st;
  }
  return sync_dir(dir_of(path));
}

}  // namespace culprit::harness
