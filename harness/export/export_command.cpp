// `culprit export`'s options, declared once (culprit/options.h), and the command: one process, no
// MPI (it reads one checkpoint and writes one file).
#include <cstdio>

#include "culprit/export.h"
#include "culprit/h5.h"
#include "culprit/harness.h"

namespace culprit::harness {

namespace {

using E = ExportOptions;

Status set_step(E* o, const std::string& text) {
  if (text == "newest") return o->step = -1, Status::OK();
  std::int64_t s = 0;
  CULPRIT_RETURN_IF_ERROR(opts::parse_number("step", text, &s));
  if (s < 0 || s > kMaxSteps)
    return Status::BadInput("option '--step' must be a checkpoint's step in [0, " + std::to_string(kMaxSteps) +
                            "] or newest, got " + text);
  o->step = s;
  return Status::OK();
}

const char* kUsage =
    "culprit export --run-dir RUN [--step S] --format torch|safetensors --out FILE [--force]\n"
    "                                      the model's state dict at a checkpoint, for torch.load or\n"
    "                                      safetensors (exit 0 written, 2 bad option, no such run or step,\n"
    "                                      FILE exists; 4 damaged checkpoint; 6 FILE cannot be written)";

}  // namespace

const opts::Table<ExportOptions>& export_options() {
  static const opts::Table<E> table("culprit export options", {
      opts::text<E>("run-dir", &E::run_dir, "the run whose checkpoint to export", opts::kRequired),
      opts::custom<E>("step", "the checkpoint's step (0: the initial parameters), or newest: the newest that verifies",
                      set_step, [](const E& o) { return o.step < 0 ? std::string("newest") : std::to_string(o.step); }),
      opts::choice<E>("format", &E::format,
                      "torch | safetensors: a file torch.load reads (a dict name -> tensor), or safetensors",
                      opts::kRequired),
      opts::text<E>("out", &E::out, "the file to write (atomically; its directory must exist)", opts::kRequired),
      opts::flag<E>("force", &E::force, "replace FILE if it exists"),
  }, /*config=*/false);
  return table;
}

cli::Command export_command() {
  return {"export", "a checkpoint's model as a PyTorch state dict (torch.load or safetensors)",
          [] { return "usage: " + std::string(kUsage) + "\n\n" + export_options().help(); },
          [](const std::vector<std::string>& args) {
            return cli::run_local<E>(args, export_options(), kUsage, nullptr, [](const E& opt, int*) {
              h5::init();
              std::string summary;
              CULPRIT_RETURN_IF_ERROR(export_checkpoint(opt, &summary));
              std::printf("%s\n", summary.c_str());
              return Status::OK();
            });
          }};
}

}  // namespace culprit::harness
