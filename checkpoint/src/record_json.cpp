#include "record_json.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "culprit/run_files.h"

namespace culprit::records::detail {

namespace fs = std::filesystem;

json header(const char* kind, int version) { return json{{"record", kind}, {"version", version}}; }
int check_header(const json& j, const char* kind, int version) {
  if (!j.is_object()) throw std::runtime_error("not a JSON object");
  if (!j.contains("record") && !j.contains("version")) return 0;
  const auto got = j.value("record", std::string());
  if (got != kind) throw std::runtime_error("not a culprit " + std::string(kind) + " record");
  const int v = j.at("version").get<int>();
  if (v < 1 || v > version)
    throw std::runtime_error("version " + std::to_string(v) + "; this culprit reads " + kind + " records up to " +
                             std::to_string(version));
  return v;
}

std::string dump(const json& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

namespace {
Status io_error(const std::string& what, const std::string& path) {
  return Status::IoError("cannot " + what + " '" + path + "': " + std::strerror(errno));
}
}  // namespace

// Records inside a run directory are replaced atomically, never through a link (run_files.h); a
// screen report goes where the user named it.
Status write_file(const std::string& path, const std::string& text, bool atomic) {
  if (atomic) return files::write_atomic(path, text);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("write", path);
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const Status st = io_error("write", path);
      ::close(fd);
      return st;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) return io_error("write", path);
  return Status::OK();
}

Status read_record_text(const std::string& path, const char* kind, std::string* text) {
  const std::string what = std::string("a culprit ") + kind + " record";
  const std::uint64_t limit = std::string(kind) == "audit" ? files::kMaxAuditBytes : files::kMaxJsonRecordBytes;
  bool absent = false;
  CULPRIT_RETURN_IF_ERROR(files::read_regular(path, limit, what.c_str(), text, &absent));
  if (absent) return Status::BadInput("'" + path + "' does not exist");
  return Status::OK();
}

Status field(const json& j, const std::string& name, const char* kind, std::string* out) {
  if (name == "record" || name == "version" || !j.contains(name)) {
    std::string valid;
    for (const auto& [k, v] : j.items())
      if (k != "record" && k != "version") valid += (valid.empty() ? "" : ", ") + k;
    return Status::BadInput("a " + std::string(kind) + " record has no field '" + name + "' (valid: " + valid + ")");
  }
  const json& v = j.at(name);
  if (v.is_string()) *out = v.get<std::string>();
  else if (v.is_null()) out->clear();
  else if (v.is_array()) {
    out->clear();
    for (const auto& e : v) *out += (out->empty() ? "" : ",") + (e.is_string() ? e.get<std::string>() : dump(e, -1));
  } else {
    *out = dump(v, -1);
  }
  return Status::OK();
}

}  // namespace culprit::records::detail
