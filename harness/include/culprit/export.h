// culprit export: a run's checkpoint as a PyTorch state dict that the user's own model loads
// (docs/checkpoint-format.md, "Exporting a checkpoint"): a torch.save-style file or safetensors.
#pragma once
#include <cstdint>
#include <iterator>
#include <string>

#include "culprit/command.h"
#include "culprit/names.h"
#include "culprit/status.h"

namespace culprit::harness {

enum class ExportFormat { kTorch, kSafetensors };
constexpr NameRow<ExportFormat> kExportFormatNames[] = {{ExportFormat::kTorch, "torch"},
                                                        {ExportFormat::kSafetensors, "safetensors"}};
constexpr NameTable<ExportFormat> enum_names(ExportFormat) {
  return {kExportFormatNames, std::size(kExportFormatNames), "format"};
}

struct ExportOptions {
  std::string run_dir;
  std::int64_t step = -1;  // -1: the newest checkpoint that verifies
  ExportFormat format = ExportFormat::kTorch;
  std::string out;
  bool force = false;  // replace an existing `out`
};

// Reads and verifies the checkpoint, writes `out` atomically (a temporary file beside it, renamed;
// never over an existing file without `force`) and fills *summary with one line for people. A
// Python run's state dict comes from its script (ExternalSource::state_dict), every other run's
// is the checkpoint's model tensors as they are.
Status export_checkpoint(const ExportOptions& opt, std::string* summary);

const opts::Table<ExportOptions>& export_options();
cli::Command export_command();

}  // namespace culprit::harness
