// The model's layer hooks (model.h's LayerObserver): injects forward and backward faults at a
// layer's output and, with --trace layer, records each layer's forward output fingerprint and,
// through a gradient hook, the fingerprint of the gradient flowing back into it.
#pragma once
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "culprit/fingerprint.h"
#include "faults/fault_plan.h"
#include "culprit/model.h"

namespace culprit::harness {

class LayerTrace : public LayerObserver {
 public:
  // record: keep per-layer fingerprints (--trace layer); otherwise faults only.
  LayerTrace(const FaultPlan* plan, const std::vector<std::string>& layers, bool record);
  // Before each micro-shard's forward: its firing context; the fingerprints start at zero.
  void begin_shard(const FireContext& c, int k);
  at::Tensor on_forward(const std::string& layer, const at::Tensor& output) override;
  // --tensor-parallel: the received parts of the exchanges (tp-link faults land here) and their
  // fingerprints: a row-parallel layer's partial product of chunk c in layer[c]'s forward slot (the
  // owner taps its own as a layer output), a column-parallel layer's partial input gradient of
  // chunk c in layer.dx[c]'s backward slot (the owner's too).
  void on_exchange(const std::string& layer, int chunk, int sender, bool backward, bool own, at::Tensor part) override;
  // The tensor-parallel group: T ranks, this one tp (world rank = group base + tp).
  void set_group(int T, int tp) {
    group_size_ = T;
    tp_ = tp;
  }
  const std::vector<Fingerprint>& forward() const { return fwd_; }
  const std::vector<Fingerprint>& backward() const { return bwd_; }
  // Each layer's output dtype in the last forward pass that reached it (--precision bf16: bfloat16
  // for the matrix products, float32 for norms and embeddings).
  const std::map<std::string, at::ScalarType>& output_dtypes() const { return dtypes_; }

 private:
  const FaultPlan* plan_;
  std::map<std::string, std::size_t> index_;
  FireContext fire_;
  int shard_ = 0;
  std::vector<Fingerprint> fwd_, bwd_;  // the current micro-shard's, per layer (empty: not recorded)
  std::map<std::string, at::ScalarType> dtypes_;
  int group_size_ = 1, tp_ = 0;
};

}  // namespace culprit::harness
