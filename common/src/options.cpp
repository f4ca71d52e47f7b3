// The option table's core: Boost.Program_options over rows of text (culprit/options.h).
#include "culprit/options.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace po = boost::program_options;

namespace culprit::opts {

namespace {

// INI files are small: anything larger is not one (and /dev/zero never ends).
constexpr std::size_t kMaxConfigBytes = 1 << 20;

po::options_description describe(const std::vector<Row>& rows, bool config, bool with_defaults, const std::string& title) {
  po::options_description d(title);
  bool positional = false;
  for (const auto& r : rows) positional = positional || (r.flags & kPositional);
  d.add_options()("help,h", "print this help");
  if (config) d.add_options()("config", po::value<std::string>(), "INI file with any of these options as key = value (the command line wins)");
  for (const auto& r : rows) {
    po::typed_value<std::string>* one = nullptr;
    po::typed_value<std::vector<std::string>>* many = nullptr;
    if (r.flags & kRepeatable) {
      if (with_defaults && (r.flags & kPositional)) continue;  // the usage line shows them
      many = po::value<std::vector<std::string>>()->composing();
      if (r.flags & kMultitoken) many->multitoken();
      d.add_options()(r.name.c_str(), many, r.help.c_str());
      continue;
    }
    one = po::value<std::string>();
    if (r.flags & kSwitch) one->implicit_value("true");
    // Beside arguments without a name, `--json FILE` must not read FILE as the switch's value.
    if ((r.flags & kSwitch) && positional) one->zero_tokens();
    if (with_defaults && !r.default_text.empty()) one->default_value(r.default_text, r.default_text);
    d.add_options()(r.name.c_str(), one, r.help.c_str());
  }
  return d;
}

void collect(const std::vector<Row>& rows, const po::variables_map& vm,
             std::vector<std::pair<std::string, std::vector<std::string>>>* values) {
  values->clear();
  for (const auto& r : rows) {
    if (!vm.count(r.name)) continue;
    if (r.flags & kRepeatable) values->push_back({r.name, vm[r.name].as<std::vector<std::string>>()});
    else values->push_back({r.name, {vm[r.name].as<std::string>()}});
  }
}

// What a path that is not a regular file is, for the message.
const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a fifo";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// An INI file is a regular file (the user's path followed to it) of at most kMaxConfigBytes: a
// directory, fifo or device is refused before it is read (a fifo would block, /dev/zero never ends).
// The type is asked of the opened descriptor, so what is read is what was checked.
Status read_config(const std::string& path, std::string* text) {
  const std::string what = "config file '" + path + "'";
  // O_NONBLOCK: opening a fifo for reading must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return Status::BadInput(what + " does not exist");
    return Status::BadInput(what + " cannot be opened: " + std::strerror(err));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::IoError(what + " cannot be read: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    return Status::BadInput(what + " is " + file_kind(st.st_mode) + ": --config takes a regular file (an INI file of options)");
  if (st.st_size > static_cast<off_t>(kMaxConfigBytes))
    return Status::BadInput(what + " is " + std::to_string(st.st_size) + " bytes, more than the " +
                            std::to_string(kMaxConfigBytes) + " bytes (1 MiB) an INI file of options may have");
  // The size can change under us (a file still being written): read at most one byte past the limit.
  std::string buf(kMaxConfigBytes + 1, '\0');
  std::size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IoError(what + " cannot be read: " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > kMaxConfigBytes)
    return Status::BadInput(what + " is more than the " + std::to_string(kMaxConfigBytes) +
                            " bytes (1 MiB) an INI file of options may have");
  buf.resize(got);
  *text = std::move(buf);
  return Status::OK();
}

}  // namespace

Status parse_rows(const std::vector<Row>& rows, const std::vector<std::string>& args, bool config,
                  std::vector<std::pair<std::string, std::vector<std::string>>>* values, bool* help) {
  const auto desc = describe(rows, config, /*with_defaults=*/false, "");
  po::positional_options_description positional;
  for (const auto& r : rows)
    if (r.flags & kPositional) positional.add(r.name.c_str(), -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).positional(positional).run(), vm);
    *help = vm.count("help") > 0;
    if (*help) return Status::OK();
    if (config && vm.count("config")) {
      std::string text;
      CULPRIT_RETURN_IF_ERROR(read_config(vm["config"].as<std::string>(), &text));
      std::istringstream in(text);
      // Values given on the command line are kept: store() never overwrites.
      po::store(po::parse_config_file(in, desc, /*allow_unregistered=*/false), vm);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    return Status::BadInput(e.what());
  }
  collect(rows, vm, values);
  return Status::OK();
}

Status parse_ini_rows(const std::vector<Row>& rows, const std::string& ini, bool allow_unknown,
                      std::vector<std::pair<std::string, std::vector<std::string>>>* values) {
  const auto desc = describe(rows, /*config=*/false, /*with_defaults=*/false, "");
  po::variables_map vm;
  try {
    std::istringstream in(ini);
    po::store(po::parse_config_file(in, desc, allow_unknown), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return Status::BadInput(e.what());
  }
  collect(rows, vm, values);
  return Status::OK();
}

std::string help_text(const std::string& title, const std::vector<Row>& rows, bool config) {
  std::ostringstream os;
  os << describe(rows, config, /*with_defaults=*/true, title);
  return os.str();
}

// ---- values ----

namespace {
// The whole text as one number (conv: a std::sto* function), or one line naming the option.
template <class T, class Conv>
Status parse_whole(const std::string& option, const std::string& text, const char* kind, Conv conv, T* out) {
  try {
    std::size_t used = 0;
    const T v = conv(text, &used);
    if (used == text.size()) {
      *out = v;
      return Status::OK();
    }
  } catch (const std::out_of_range&) {
    return Status::BadInput("option '--" + option + "': " + text + " is out of range");
  } catch (const std::exception&) {
  }
  return Status::BadInput("option '--" + option + "': '" + text + "' is not " + kind);
}
}  // namespace

Status parse_number(const std::string& option, const std::string& text, std::int64_t* out) {
  return parse_whole<std::int64_t>(option, text, "an integer",
                                   [](const std::string& t, std::size_t* n) { return std::stoll(t, n); }, out);
}

Status parse_number(const std::string& option, const std::string& text, std::uint64_t* out) {
  // stoull takes "-1" as its wrap-around.
  if (!text.empty() && text[0] == '-') return Status::BadInput("option '--" + option + "' must not be negative");
  return parse_whole<std::uint64_t>(option, text, "an integer",
                                    [](const std::string& t, std::size_t* n) { return std::stoull(t, n); }, out);
}

Status parse_number(const std::string& option, const std::string& text, double* out) {
  return parse_whole<double>(option, text, "a number", [](const std::string& t, std::size_t* n) { return std::stod(t, n); },
                             out);
}

Status parse_bool(const std::string& option, const std::string& text, bool* out) {
  // What Boost.Program_options accepts for a bool.
  for (const char* t : {"true", "1", "yes", "on"})
    if (text == t) return *out = true, Status::OK();
  for (const char* f : {"false", "0", "no", "off"})
    if (text == f) return *out = false, Status::OK();
  return Status::BadInput("option '--" + option + "': '" + text + "' is not true or false");
}

std::string format_number(double v) {
  // The shortest of %.1g .. %.17g that reads back bitwise (INI text must resume the same run).
  char buf[40];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace culprit::opts
