// Prints the feistel order for tests/integration/test_order.py to compare with its Python twin:
//   culprit_order_dump SEED EPOCH N FIRST COUNT [sample|position]
// one line per index i in [FIRST, FIRST+COUNT): sample_at(i) (default) or position_of(i).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#include "data/order.h"

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: %s SEED EPOCH N FIRST COUNT [sample|position]\n", argv[0]);
    return 2;
  }
  try {
    const std::uint64_t seed = std::stoull(argv[1]);
    const std::int64_t epoch = std::stoll(argv[2]), n = std::stoll(argv[3]);
    const std::int64_t first = std::stoll(argv[4]), count = std::stoll(argv[5]);
    const bool inverse = argc == 7 && std::strcmp(argv[6], "position") == 0;
    if (argc == 7 && !inverse && std::strcmp(argv[6], "sample") != 0) throw std::invalid_argument(argv[6]);
    const culprit::harness::FeistelOrder order(seed, epoch, n);
    for (std::int64_t i = first; i < first + count; ++i)
      std::printf("%lld\n", static_cast<long long>(inverse ? order.position_of(i) : order.sample_at(i)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "culprit_order_dump: %s\n", e.what());
    return 2;
  }
  return 0;
}
