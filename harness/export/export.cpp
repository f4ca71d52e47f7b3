// `culprit export`: the checkpoint of a step, read and verified as every reader of a run reads it,
// as the state dict of the run's model, in a file PyTorch reads (formats.h), written atomically
// (output_file.h).
#include "culprit/export.h"

#include <cstring>
#include <filesystem>

#include "culprit/checkpoint.h"
#include "culprit/checkpoint_format.h"
#include "culprit/external.h"
#include "culprit/harness.h"
#include "culprit/run_files.h"
#include "culprit/tensors.h"
#include "export/formats.h"
#include "export/output_file.h"

namespace culprit::harness {

namespace fs = std::filesystem;

namespace {

std::string steps_of(const std::vector<std::pair<std::int64_t, std::string>>& all) {
  std::string out;
  for (const auto& e : all) out += (out.empty() ? "" : ", ") + std::to_string(e.first);
  return out;
}

// --step's checkpoint, verified; or the newest one that verifies (a damaged one is named and
// skipped, as --resume and replay skip it: ckpt::find_valid on this one process).
Status pick_checkpoint(const ExportOptions& opt, ckpt::Checkpoint* c, std::string* path) {
  const auto all = ckpt::list(opt.run_dir);
  if (all.empty()) return Status::BadInput("run '" + opt.run_dir + "' has no checkpoint");
  if (opt.step < 0) return ckpt::find_valid(Comm{}, opt.run_dir, ckpt::kAnyStep, ckpt::Pick::kNewest, c, path);
  for (const auto& [step, p] : all)
    if (step == opt.step) {
      *path = p;
      return ckpt::read(p, c, /*verify=*/true).prefixed("cannot export step " + std::to_string(step));
    }
  return Status::BadInput("run '" + opt.run_dir + "' has no checkpoint of step " + std::to_string(opt.step) +
                          "; it has checkpoints of steps " + steps_of(all));
}

// The checkpoint is this run's (its identity, the step its name says, the model run.json names):
// a checkpoint renamed into the run is refused, never exported as the run's.
Status check_belongs(const TrainConfig& cfg, const ckpt::Checkpoint& c, const std::string& path) {
  std::string run_id;
  CULPRIT_RETURN_IF_ERROR(stored_run_id(cfg.run_dir, &run_id));
  CULPRIT_RETURN_IF_ERROR(ckpt::belongs(path, c, run_id));
  const auto model = c.meta.find("model");
  if (model != c.meta.end() && model->second != cfg.model.text())
    return Status::BadInput("checkpoint '" + path + "' belongs to another run (model " + model->second + ", not " +
                            cfg.model.text() + ")");
  return Status::OK();
}

// An --out inside the run directory is the user's choice, but never one of the names culprit
// writes there (run.json, checkpoints/, trace/, ...): an export must not replace the run's record.
Status check_not_a_run_file(const std::string& run_dir, const std::string& out) {
  std::error_code ec1, ec2;
  const fs::path run = fs::weakly_canonical(run_dir, ec1), target = fs::weakly_canonical(out, ec2);
  if (ec1 || ec2) return Status::OK();  // unreachable paths: reading or writing them says why
  const fs::path rel = target.lexically_relative(run);
  if (rel.empty() || *rel.begin() == "..") return Status::OK();
  const std::string first = rel.begin()->string();
  bool owned = first == "." || first == ".lock";
  for (const char* const* n = files::owned_names(); *n; ++n) owned = owned || first == *n;
  if (!owned) return Status::OK();
  return Status::BadInput("--out '" + out + "' is the run's own '" + first +
                          "': an export goes beside the run's files, never over them");
}

// The checkpoint's model tensors (state-dict order) as host tensors.
Status saved_tensors(const ckpt::Checkpoint& c, std::vector<NamedTensor>* out) {
  return guarded(StatusCode::kInternal, "reading the checkpoint's tensors", [&] {
    for (const auto& r : c.model) {
      at::Tensor t = at::empty(r.shape, at::TensorOptions().dtype(to_scalar(r.dtype)));
      if (r.sliced() || r.bytes.size() != static_cast<std::size_t>(t.numel() * t.element_size()))
        return Status::Damaged("checkpoint tensor 'model/" + r.name + "' holds " + std::to_string(r.bytes.size()) +
                               " bytes, not its shape's");
      if (!r.bytes.empty()) std::memcpy(t.data_ptr(), r.bytes.data(), r.bytes.size());
      out->push_back({r.name, t});
    }
    return Status::OK();
  });
}

// The state dict the export holds: a Python run's from its script (every name its model's
// state_dict() has: tied tensors under each name, persistent buffers), any other run's the
// checkpoint's model tensors (culprit's models name each tensor once).
Status state_dict(const TrainConfig& cfg, const ckpt::Checkpoint& c, std::vector<NamedTensor>* out) {
  std::vector<NamedTensor> saved;
  CULPRIT_RETURN_IF_ERROR(saved_tensors(c, &saved));
  if (cfg.model.kind != ModelKind::kPython) {
    *out = std::move(saved);
    return Status::OK();
  }
  const ExternalSource* ext = external_source();
  if (!ext || !ext->state_dict)
    return Status::BadInput("run '" + cfg.run_dir + "' was made from Python (model " + cfg.model.text() +
                            "): its state dict comes from its script; run `python3 -m culprit export ...` (docs/python.md)");
  return ext->state_dict(cfg, saved, out);
}

}  // namespace

Status export_checkpoint(const ExportOptions& opt, std::string* summary) {
  CULPRIT_RETURN_IF_ERROR(check_output(opt.out, opt.force));
  TrainConfig cfg;
  CULPRIT_RETURN_IF_ERROR(load_run_config(opt.run_dir, &cfg));
  CULPRIT_RETURN_IF_ERROR(check_not_a_run_file(opt.run_dir, opt.out));
  ckpt::Checkpoint c;
  std::string path;
  CULPRIT_RETURN_IF_ERROR(pick_checkpoint(opt, &c, &path));
  CULPRIT_RETURN_IF_ERROR(check_belongs(cfg, c, path));
  std::vector<NamedTensor> tensors;
  CULPRIT_RETURN_IF_ERROR(state_dict(cfg, c, &tensors));
  std::string bytes;
  if (opt.format == ExportFormat::kTorch) {
    CULPRIT_RETURN_IF_ERROR(encode_torch(tensors, &bytes));
  } else {
    const auto id = c.meta.find(format::kMetaRunId);
    std::map<std::string, std::string> meta = {{"format", "pt"}, {"culprit_step", std::to_string(c.step)}};
    if (id != c.meta.end() && !id->second.empty()) meta["culprit_run_id"] = id->second;
    CULPRIT_RETURN_IF_ERROR(encode_safetensors(tensors, meta, &bytes));
  }
  CULPRIT_RETURN_IF_ERROR(write_output(opt.out, bytes, opt.force));
  *summary = "exported step " + std::to_string(c.step) + " of run '" + opt.run_dir + "' (" +
             std::to_string(tensors.size()) + " tensors, " + name_of(opt.format) + ", " + std::to_string(bytes.size()) +
             " bytes) to '" + opt.out + "'";
  return Status::OK();
}

}  // namespace culprit::harness
