// The registration of `--data python` (culprit/data.h; the Python package makes it through
// culprit/external.h, which also registers the model).
#include "culprit/data.h"

namespace culprit::harness {

namespace {
OpenExternalData& registered() {
  static OpenExternalData open;
  return open;
}
}  // namespace

void set_external_data(OpenExternalData open) { registered() = std::move(open); }

const OpenExternalData& external_data() { return registered(); }

Status no_external_source(const std::string& what) {
  return Status::BadInput(what + " is built by a Python script: run it through the Python package "
                          "(mpirun -np W python SCRIPT ..., or python3 -m culprit COMMAND; docs/python.md)");
}

}  // namespace culprit::harness
