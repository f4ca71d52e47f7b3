#include "external.h"

namespace culprit::harness {

namespace {
std::unique_ptr<ExternalSource>& registered() {
  static std::unique_ptr<ExternalSource> s;
  return s;
}
}  // namespace

void set_external_source(ExternalSource source) { registered() = std::make_unique<ExternalSource>(std::move(source)); }

void clear_external_source() { registered().reset(); }

const ExternalSource* external_source() { return registered().get(); }

Status no_external_source(const std::string& what) {
  return Status::BadInput(what + " is built by a Python script: run it through the Python package "
                          "(mpirun -np W /usr/bin/python3 SCRIPT ..., or python3 -m culprit COMMAND; docs/python.md)");
}

}  // namespace culprit::harness
