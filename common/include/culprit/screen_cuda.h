// The GPU side of culprit screen (docs/screen.md): the known-answer tests of screen_kernels.h run on
// one CUDA device, their results fingerprinted there. Built when nvcc is found (CULPRIT_HAVE_CUDA).
#pragma once
#include <cstddef>
#include <string>

#include "culprit/fingerprint.h"
#include "culprit/fingerprint_cuda.h"  // device_count
#include "culprit/status.h"

namespace culprit::cuda {

std::string device_name(int device);
// A bit flipped in a test's result before it is fingerprinted (testing the screen); test -1: none.
struct ScreenFlip {
  int test = -1;
  std::size_t index = 0;
  int bit = 0;
};
// One repetition of the three tests (matmul, reduce, pointwise; n x n) on `device`: the fingerprint of
// each result, computed on the device.
Status screen_once(int device, int n, const ScreenFlip& flip, Fingerprint out[3]);

}  // namespace culprit::cuda
