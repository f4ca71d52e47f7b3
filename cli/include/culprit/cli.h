// culprit's command line: every command's dispatch, shared by the culprit executable and the Python
// package (python/), which runs the same commands on a user's PyTorch model.
#pragma once
#include <string>
#include <vector>

namespace culprit::cli {

// Runs `culprit ARGS...` (ARGS without the program name) and returns the exit code (README.md).
int run_command_line(std::vector<std::string> args);

// The commands' names, in `culprit --help` order.
std::vector<std::string> command_names();

}  // namespace culprit::cli
