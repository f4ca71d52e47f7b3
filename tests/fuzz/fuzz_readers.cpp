// libFuzzer target: the checkpoint and trace readers on arbitrary bytes, opened as in-memory HDF5
// file images (no disk I/O). Any crash, hang, sanitizer report or oversized allocation is a bug;
// a clean error Status is the expected answer to garbage.
//   build: CULPRIT_PRESET=fuzz scripts/setup.sh (clang, -fsanitize=fuzzer,address)
//   run:   build-fuzz/tests/fuzz_readers -max_total_time=600 CORPUS_DIR
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "culprit/checkpoint.h"
#include "culprit/h5.h"
#include "culprit/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static bool once = [] {
    culprit::h5::init();
    return true;
  }();
  (void)once;
  if (size < 8) return 0;
  std::vector<std::uint8_t> image(data, data + size);
  culprit::h5::Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_core(fapl.id(), 1 << 16, /*backing_store=*/0);
  if (H5Pset_file_image(fapl.id(), image.data(), image.size()) < 0) return 0;
  culprit::h5::Handle file(H5Fopen("fuzz-image.h5", H5F_ACC_RDONLY, fapl.id()), H5Fclose);
  if (!file.valid()) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  culprit::ckpt::Checkpoint c;
  (void)culprit::ckpt::read_open(file, "fuzz-image.h5", size, &c, /*verify=*/true);
  culprit::trace::TraceFile t;
  (void)culprit::trace::read_open(file, "fuzz-image.h5", &t);
  H5Eclear2(H5E_DEFAULT);
  return 0;
}
