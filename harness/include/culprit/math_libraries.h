// The math libraries under libtorch's CPU kernels (MKL, oneDNN, ATen's own vectorised kernels):
// pinned where culprit can pin them, recorded in RUN/run.json ("math"), and compared by every
// command that must reproduce a run's bits (docs/determinism.md, "The math libraries").
#pragma once
#include <string>

#include "culprit/status.h"

namespace culprit::harness {

struct MathLibraries;  // config/run_info.h: what run.json records of them

// MKL's conditional numerical reproducibility on the branch this CPU picks (MKL_CBWR=AUTO: results
// independent of memory alignment, and here the same bits as eager PyTorch's default), unless the
// environment chose a mode (MKL_CBWR); MKL's and OpenMP's dynamic thread counts off. Takes effect
// only before MKL's first computation in the process: called at start-up, and again (doing
// nothing) by setup_determinism.
void pin_math_libraries();
// OK unless MKL computed before culprit could pin its mode (a Python script that used torch before
// importing culprit) and the environment chose none: a run so made would record MKL without CNR,
// which no later process of culprit's reproduces. Bad input naming the remedy. Local: the caller agrees.
Status check_math_pinned();
// This process's math libraries, as recorded in run.json.
MathLibraries math_libraries();
// OK when RUN recorded none or the same math libraries as this process's; otherwise bad input
// naming what differs and that `doing` ("replaying its steps", "resuming it") would not reproduce
// the run's bits. Local (no collective): the caller agrees.
Status check_math_libraries(const std::string& run_dir, const std::string& doing);

}  // namespace culprit::harness
