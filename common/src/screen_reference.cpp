// Compiled with -ffp-contract=off (common/CMakeLists.txt): every product and sum rounded on its own,
// as the GPU kernels do with __fmul_rn/__fadd_rn.
#include "culprit/screen_kernels.h"

namespace culprit::screen {

void reference(int n, std::vector<float>* matmul, std::vector<float>* reduce, std::vector<float>* pointwise) {
  const std::size_t N = static_cast<std::size_t>(n);
  std::vector<float> a(N * N), b(N * N);
  for (std::size_t i = 0; i < N * N; ++i) a[i] = input_value(0, i), b[i] = input_value(1, i);
  matmul->assign(N * N, 0.0f);
  reduce->assign(N, 0.0f);
  pointwise->assign(N * N, 0.0f);
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (std::size_t k = 0; k < N; ++k) {
        const float p = a[i * N + k] * b[k * N + j];
        acc = acc + p;
      }
      (*matmul)[i * N + j] = acc;
    }
  for (std::size_t i = 0; i < N; ++i) {
    float acc = 0.0f;
    for (std::size_t j = 0; j < N; ++j) {
      const float p = a[i * N + j] * b[i * N + j];
      acc = acc + p;
    }
    (*reduce)[i] = acc;
  }
  for (std::size_t i = 0; i < N * N; ++i) {
    const float ab = a[i] * b[i];
    const float num = ab + a[i];
    const float bb = b[i] * b[i];
    const float den = 1.0f + bb;
    (*pointwise)[i] = num / den;
  }
}

}  // namespace culprit::screen
