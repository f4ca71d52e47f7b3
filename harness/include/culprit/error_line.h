// One readable line out of a libtorch exception message (which may carry a TorchScript
// interpreter trace and a C++ backtrace).
#pragma once
#include <string>

namespace culprit::harness {

inline std::string error_line(const std::string& what) {
  // TorchScript: the cause is the last "SomethingError: ..." line of the interpreter trace.
  if (what.find("TorchScript interpreter") != std::string::npos) {
    std::string best;
    std::size_t pos = 0;
    while (pos < what.size()) {
      std::size_t end = what.find('\n', pos);
      if (end == std::string::npos) end = what.size();
      const std::string line = what.substr(pos, end - pos);
      const std::size_t colon = line.find("Error: ");
      if (colon != std::string::npos && line.find(' ') > colon) best = line.substr(colon + 7);
      pos = end + 1;
    }
    if (!best.empty()) return best;
  }
  return what.substr(0, what.find('\n'));
}

}  // namespace culprit::harness
