// How much memory a configuration asks for, estimated before anything is allocated (no libtorch):
// a size option that does not fit the machine is one line naming it, not std::bad_alloc or a run
// that swaps for hours. The parameter count follows models.cpp (a unit test compares the two).
#pragma once
#include <cstdint>
#include <vector>

#include "culprit/harness.h"
#include "culprit/status.h"

namespace culprit::harness {

// Parameters of a built-in model for samples of shape x_shape and `out` outputs (classes, targets,
// gpt's vocabulary). A double: the products of option values overflow every integer type long
// before they are refused. x_shape must be one the model accepts.
// c: --hidden (mlp) and the gpt options.
double builtin_parameters(const TrainConfig& c, const std::vector<std::int64_t>& x_shape, double out);

// Bytes per rank the training state of `parameters` parameters needs: the parameters, their
// gradients, the reduced gradient, the reduction tree's blocks, the optimizer's state and the
// checkpoint's copy.
// world: the ranks a --shard-optimizer run spreads its optimizer state over (1: whole here).
double state_bytes(const TrainConfig& c, double parameters, int world = 1);

// The synthetic data set, the built-in model and its state against the machine's memory, from the
// options alone (validate(): before the run directory is made or anything allocated).
Status check_synthetic_sizes(const TrainConfig& c, int world = 1);

// A built-in model for loaded data against the machine's memory (make_model(): before it is built).
Status check_model_size(const TrainConfig& c, const std::vector<std::int64_t>& x_shape, std::int64_t out,
                        int world = 1);

// --shuffle randperm holds two epochs' orders (8 bytes a sample each): refused when they would not fit.
Status check_order_size(const TrainConfig& c, std::int64_t n);

}  // namespace culprit::harness
