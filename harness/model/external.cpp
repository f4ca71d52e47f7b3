#include "culprit/external.h"

namespace culprit::harness {

namespace {
std::unique_ptr<ExternalSource>& registered() {
  static std::unique_ptr<ExternalSource> s;
  return s;
}
}  // namespace

void set_external_source(ExternalSource source) {
  set_external_data(source.open_data);  // data/ opens the data set; make_model (models.cpp) asks here
  registered() = std::make_unique<ExternalSource>(std::move(source));
}

void clear_external_source() {
  set_external_data({});
  registered().reset();
}

const ExternalSource* external_source() { return registered().get(); }

}  // namespace culprit::harness
