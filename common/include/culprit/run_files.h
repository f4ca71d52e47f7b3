// Writing inside a run directory (docs/architecture.md, "Security model"). Every file culprit
// creates, appends to, replaces or deletes in a run directory goes through these calls, so that:
//  - a symbolic link inside the run directory is never followed: a link where culprit writes a file
//    is replaced (never written through) or refused, and a linked checkpoints/, trace/ or audit/ is
//    refused, so nothing outside the run directory is written or deleted;
//  - a failed write leaves no half-written file: replacements go through a fresh temporary file,
//    fsync and rename (the commit point), and the temporary is removed on failure;
//  - the OS's reason (ENOSPC, EIO, EROFS ...) and the file are in the one line of the Status (kIo).
// The run directory itself may be a link (a user's choice, e.g. onto a scratch filesystem).
// No libtorch, no MPI: callers decide which rank writes and agree() on the result.
#pragma once

#include <cstdint>
#include <string>

#include "culprit/status.h"

namespace culprit::files {

// `path` must not be a symbolic link (BadInput naming it if it is); absent is fine.
Status refuse_link(const std::string& path);

// A directory culprit owns inside a run directory (checkpoints/, trace/, audit/): created when
// absent; refused when it is a link or not a directory.
Status ensure_dir(const std::string& path);

// Appends `text` to `path` (created 0644 when absent) in one write(2), then fsync. A link at
// `path` is refused (O_NOFOLLOW), not followed.
Status append(const std::string& path, const std::string& text);

// Opens `path` for appending (created when absent; a link refused), for a long-lived stream
// (metrics.jsonl). The caller owns the descriptor.
Status open_append(const std::string& path, int* fd);

// Makes `path` a new, empty regular file: whatever is there (a leftover, a link) is unlinked
// first, never followed; created with O_EXCL | O_NOFOLLOW. For files a library then opens by
// name with truncation (HDF5's H5Fcreate).
Status create_fresh(const std::string& path);

// Replaces `path` with `text` atomically: written to a fresh `path`.tmp, fsynced, renamed over
// `path` (which may be a link: rename replaces the link itself), the directory fsynced. On any
// failure `path` is as it was and the temporary is removed.
Status write_atomic(const std::string& path, const std::string& text);

// A line-per-record file (incidents.jsonl, checkpoints.jsonl, ...) whose last line lacks its
// newline (an append a crash or a full disk cut short) loses that torn line, atomically, so the
// next append starts a line of its own. Absent, empty or whole files are left as they are.
Status cut_torn_tail(const std::string& path);

// Deletes the file `path` (a link is removed itself, its target untouched). Absent is fine.
Status remove(const std::string& path);
// remove(), then fsyncs the directory when something was deleted, so that the file does not come
// back after a crash of the machine (a record whose absence others rely on: a stale diagnosis).
Status remove_durably(const std::string& path);

// Renames `from` to `to` in one directory, replacing `to` (a link at either is moved or replaced
// itself, never followed), then fsyncs the directory so the new name survives a crash.
Status move(const std::string& from, const std::string& to);

// Bytes available to this user on the filesystem holding `path` (statvfs).
Status free_bytes(const std::string& path, std::uint64_t* out);

// ---- reading a run's records ----
// Records are data, not trusted (docs/architecture.md): a reader opens one only if it is a regular
// file (a fifo would block the reader forever, a device never end) and no larger than its kind can
// be (a huge or sparse file would exhaust memory). The open is O_NONBLOCK, and the type is checked
// on the open descriptor (fstat), so nothing blocks before the check. A link is followed to its
// target (reading through a link writes nothing), which must be a regular file too.

// Opens `path` for reading: *fd >= 0 and *size its length; an absent file is OK with *fd = -1.
// Not a regular file, or larger than `max_bytes`: Damaged naming the file, what it is and the limit
// (`what` names the record kind, "incident records"). Other failures (permissions): IoError.
Status open_regular(const std::string& path, std::uint64_t max_bytes, const char* what, int* fd,
                    std::uint64_t* size = nullptr);

// The whole of a record file (open_regular's checks): *absent says whether it was there at all.
Status read_regular(const std::string& path, std::uint64_t max_bytes, const char* what, std::string* out,
                    bool* absent = nullptr);

// Reads a line-per-record file line by line, no line longer than `max_line` bytes (a longer one is
// Damaged, naming its number). next() gives each line without its newline; *whole says whether it
// ended with one (the last line of a file an append cut short does not). Returns false at the end
// or on an error (status() says which).
class LineReader {
 public:
  LineReader(int fd, std::string path, std::size_t max_line);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  bool next(std::string* line, bool* whole);
  std::int64_t line_number() const { return lineno_; }  // of the line next() gave, 1-based
  std::uint64_t offset() const { return start_; }        // its first byte's offset in the file
  const Status& status() const { return status_; }

 private:
  int fd_;
  std::string path_;
  std::size_t max_line_;
  std::string buf_;
  std::size_t at_ = 0;
  bool eof_ = false;
  std::uint64_t consumed_ = 0, start_ = 0;
  std::int64_t lineno_ = 0;
  Status status_;
};

// Replaces `path` with its first `length` bytes, atomically (copied to a fresh `path`.tmp,
// fsynced, renamed): a crash leaves the old file or the shortened one. Streams: no size limit.
Status keep_prefix(const std::string& path, std::uint64_t length);

// Limits of the record kinds (docs/records.md): far above what a run writes, far below memory.
constexpr std::uint64_t kMaxJsonRecordBytes = std::uint64_t{64} << 20;     // run.json, diagnosis, screen
constexpr std::uint64_t kMaxAuditBytes = std::uint64_t{256} << 20;         // audit.json (an interval a line)
constexpr std::uint64_t kMaxIncidentFileBytes = std::uint64_t{1} << 30;     // incidents.jsonl
constexpr std::size_t kMaxRecordLine = std::size_t{1} << 20;                // one line of a .jsonl file

// The run-directory lock: RUN/.lock, flock(2)-ed for the life of the process. Writers of the run
// (train, bisect) hold it exclusively; audit, whose array shares read the run side by side and
// write only their own parts, holds it shared. The kernel drops the lock when the process ends in
// any way (exit, crash, SIGKILL), so a lock left by a crashed job is free again: a stale .lock
// file is only a file. The file says who took it (command, host, pid, Slurm job, time) for the
// one line a refused job prints; a holder it names that is no longer alive on this host is not
// named as the one in the way (another holder is, from /proc/locks where the kernel says). It is
// created 0600: someone who may only read the run cannot lock it (nor keep its owner out).
// Taking it again in the same process succeeds (train --on-detect diagnose runs bisect). A run
// directory without run.json is not locked by bisect or audit (there is no run to guard).
enum class Lock { kExclusive, kShared };
Status lock_run_dir(const std::string& run_dir, const std::string& command, Lock mode = Lock::kExclusive);

// For commands that only read a run (verify RUN, replay): the run must not be in the middle of
// being written. Takes the lock shared for the life of the process when it can; a run another job
// holds exclusively (train, bisect) is BadInput "in use", naming the holder, like a writer's
// refusal. Takes nothing, and refuses nothing, when there is no .lock (no job ever wrote the run)
// or it cannot be opened (a read-only archive, another user's run): nobody can be writing a run
// that nobody could lock.
Status check_not_in_use(const std::string& run_dir, const std::string& command);

// A file of the run `ours` is one whose recorded run identity `theirs` is the same; a file or run
// from before identities (either empty) passes. Otherwise Damaged naming `file` and both
// (a foreign file in a run directory is damage to the run, exit 4; --resume-from makes it BadInput).
Status same_run(const std::string& file, const std::string& theirs, const std::string& ours);

// A new run identity: 16 hex digits from the host, pid, time and the system's randomness.
std::string new_run_id();

// The names culprit writes in a run directory (a directory holding none of them is a new one).
const char* const* owned_names();

}  // namespace culprit::files
