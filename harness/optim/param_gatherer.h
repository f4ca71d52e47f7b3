// --shard-params (ZeRO-3, as FSDP; docs/determinism.md, "Sharded parameters"): each rank keeps only
// its slice of the flat parameter buffer (the --shard-optimizer slices, shard_layout.h); a layer's
// parameters are gathered just before its forward and again before its backward, and released
// after each. This class owns that: the buffer's pages (a parameter not gathered has no memory:
// its pages are returned to the kernel and made inaccessible, so a stray read fails loudly instead
// of reading zeros), which parameters each layer uses, the gathers (collectives, in the same order
// on every rank), and the hooks that trigger them.
//
// Why pages and not a storage per layer: the parameters stay views of one flat buffer, so the
// reduction, the optimizer's slots, the fingerprints and the checkpoint keep their one layout; a
// released parameter keeps its address, so the tensors autograd saved for the backward pass are
// still the parameter, filled again by the gather before that backward runs.
//
// The gather order is the model's call order, the same on every rank for every micro-shard. A rank
// without a micro-shard in a round (W does not divide M) repeats the collectives of its last one
// without computing (a phantom round): its gathers, and the gradient's reduce-scatter pieces posted
// between them (note_post), in their order, so every rank makes the same collectives in the same
// order and none waits for one another rank makes only later.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/function.h>

#include "culprit/fingerprint.h"
#include "culprit/model.h"
#include "culprit/mpi_util.h"
#include "model/flat_params.h"
#include "optim/shard_layout.h"

namespace culprit::harness {

// The flat parameter buffer of a --shard-params run: page-aligned anonymous memory whose pages can
// be returned to the kernel and made inaccessible (madvise, mprotect) and given back.
at::Tensor paged_flat_buffer(std::int64_t elements);

class ParamGatherer : public LayerObserver {
 public:
  // flat, layout and inner (the layer trace, or null) must outlive it. A layer uses the parameters
  // its name prefixes, and `uses` names others: (layer, parameter name), from the model's borrowed
  // and tied parameters. keep: --keep-gathered (a layer gathered once per step stays until the
  // step's micro-shards are all computed).
  ParamGatherer(const Comm& comm, FlatParams& flat, const ShardLayout& layout, const std::vector<std::string>& layers,
                const std::vector<std::pair<std::string, std::string>>& uses, bool keep, LayerObserver* inner);
  ~ParamGatherer() override;
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  // Releases every parameter this rank does not own: from here on only its slice has memory. The
  // layers seen called until then (the setup's checks run a forward pass through this observer)
  // gather their parameters; a layer never seen called leaves its parameters gathered all along.
  void shard();
  // Makes the whole buffer accessible again (a restore writes every parameter), until shard().
  void unshard();

  // The step's compute: begin_step before the first micro-shard; begin_shard/end_shard around each
  // micro-shard's forward and backward, or phantom() in a round without one; end_step after the
  // last, which releases everything.
  void begin_step();
  void begin_shard();
  void end_shard();
  void phantom();
  void end_step();
  // A reduce-scatter piece [a, b) posted during the micro-shard (logged for phantom rounds, which
  // post it again through `poster`).
  void note_post(std::int64_t a, std::int64_t b) {
    if (logging_) log_.push_back({true, a, b});
  }
  void set_poster(std::function<void(std::int64_t, std::int64_t)> poster) { poster_ = std::move(poster); }

  // LayerObserver: the layer's parameters gathered before its forward; after it, released, with a
  // hook that gathers them again before the layer's backward.
  void on_enter(const std::string& layer) override;
  at::Tensor on_forward(const std::string& layer, const at::Tensor& output) override;

  // The gather check (--comm-check): every chunk's hash as its owner recorded it after the last
  // update (layout chunk order; what the composed fingerprints were made of). A parameter's first
  // gather in a step is compared with them on every rank that receives it, and on its owner: the
  // first chunk that differs is mismatch() (-1: none), until the next begin_step.
  void expect(std::vector<std::uint64_t> hashes) { expected_ = std::move(hashes); }
  std::int64_t mismatch() const { return mismatch_; }
  // Called with a parameter's index just before its first gather of the step (the faults of
  // phase gather: FaultPlan::on_gather).
  void set_before_gather(std::function<void(std::size_t)> f) { before_gather_ = std::move(f); }
  // Called with a parameter's index just after its first gather of the step, before its check (the
  // faults of phase gather-link: FaultPlan::on_gather_link).
  void set_after_gather(std::function<void(std::size_t)> f) { after_gather_ = std::move(f); }
  void set_check(bool on) { check_ = on; }

  // This rank's fp1 chunk hashes of its slice (layout first_chunk order), for the composed
  // fingerprints; and whether its slice is finite.
  std::vector<std::uint64_t> own_chunk_hashes() const;
  bool own_finite() const;
  // The flat elements this rank holds: [lo, hi).
  std::int64_t lo() const { return lo_; }
  std::int64_t hi() const { return hi_; }
  std::int64_t gathers() const { return gathers_; }      // collectives made so far
  std::int64_t gathered_bytes() const { return bytes_; }  // their bytes received

 private:
  void gather(const std::vector<std::size_t>& params);    // those not gathered yet, collectively
  void release(const std::vector<std::size_t>& params);   // their pages outside the slice
  void gather_range(std::int64_t a, std::int64_t b);      // one collective: flat elements [a, b)
  void drop_pages(std::int64_t a, std::int64_t b);        // pages in [a, b) no gathered element needs
  void protect(std::int64_t a, std::int64_t b, bool access);
  void param_final(std::size_t i);                        // the hook after i's gradient accumulator
  int param_at(std::int64_t e) const;
  void verify(std::size_t i);  // parameter i as gathered against its owners' recorded chunk hashes

  Comm comm_;                  // a duplicate: the gathers never meet another collective
  FlatParams& flat_;
  const ShardLayout& layout_;
  bool keep_;
  LayerObserver* inner_;
  float* base_ = nullptr;
  std::int64_t lo_ = 0, hi_ = 0;
  std::size_t page_ = 4096;    // elements per page: page_ / sizeof(float)
  std::vector<std::vector<std::size_t>> unit_;   // per layer: the parameters it uses
  std::unordered_map<std::string, std::size_t> unit_of_;  // layer name -> its index (called per layer call)
  std::vector<std::size_t> resident_;            // parameters no layer (that is called) names: gathered for
                                                 // the whole step; sorted
  std::vector<char> entered_;                    // per layer: called in a forward pass before shard()
  std::vector<char> gathered_;                   // per parameter
  bool sharded_ = false;
  bool in_backward_ = false;
  bool logging_ = false;                         // recording the micro-shard's collectives
  struct Logged {
    bool post = false;  // a reduce-scatter piece; else a gather
    std::int64_t a = 0, b = 0;
  };
  std::vector<Logged> log_;                      // the last micro-shard's collectives, in order
  std::function<void(std::int64_t, std::int64_t)> poster_;
  int shards_ = 0;                               // micro-shards computed this step
  std::int64_t gathers_ = 0, bytes_ = 0;
  std::vector<std::uint64_t> expected_;         // every chunk's hash as its owner recorded it
  std::vector<char> seen_;                      // per parameter: gathered once this step
  std::int64_t mismatch_ = -1;
  bool check_ = false;
  std::function<void(std::size_t)> before_gather_, after_gather_;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, std::uintptr_t>> hooks_;
};

}  // namespace culprit::harness
