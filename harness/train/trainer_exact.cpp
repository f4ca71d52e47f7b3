// The last step's update re-executed element by element in float32 (optim/exact_update.h): the
// bisection's exact referee for a tie of two devices over an update (docs/bisect.md, "Settling a
// tie"). From the marked state's parameters and optimizer state, with the step's reduced gradient
// (clipped by the step's own factor) and learning rate, on copies: the live state is not touched.
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "optim/exact_update.h"
#include "train/state_values.h"
#include "train/trainer.h"

namespace culprit::harness {


bool Trainer::update_exact(const ckpt::Checkpoint& start, std::vector<float>* now, std::vector<float>* exact,
                           std::string* why) {
  if (!opt_->known()) {
    *why = "--optimizer script: culprit does not know the update of the script's " + cfg_.optim.script_optimizer;
    return false;
  }
  if (sharded()) {
    // Each rank updated its slice only; the referee would need every slice's state from the gather.
    *why = "--shard-optimizer: each rank holds only its slice of the optimizer state";
    return false;
  }
  std::map<std::string, const ckpt::RawTensor*> marked;
  for (const auto& r : start.model) marked[r.name] = &r;
  for (const auto& r : start.optimizer) marked[r.name] = &r;
  const std::size_t P = static_cast<std::size_t>(flat_.size);
  now->assign(2 * P, 0.0f);
  exact->assign(2 * P, 0.0f);
  const bool sgd = cfg_.optim.kind == OptimizerKind::kSgd;
  for (std::size_t i = 0; i < flat_.params.size(); ++i) {
    const auto& name = flat_.params[i].name;
    const auto off = static_cast<std::size_t>(flat_.offsets[i]);
    const auto n = static_cast<std::size_t>(flat_.sizes[i]);
    ExactParam x;
    x.p = exact->data() + off;
    x.primary = exact->data() + P + off;
    x.n = n;
    x.decay = flat_.decay[i];
    put(view_of(*marked.at(name)), x.p);
    std::vector<float> g(reduced() + off,
                         reduced() + off + n);
    if (cfg_.optim.clip_grad_norm > 0)
      for (float& v : g) v = v * step_.clip_factor;  // Trainer::clip's mul_out by the 0-dim factor
    x.g = g.data();
    std::vector<float> second(n, 0.0f);
    x.second = second.data();
    const auto first = marked.find(name + (sgd ? "/momentum_buffer" : "/exp_avg"));
    x.has_state = first != marked.end();
    if (x.has_state) {
      put(view_of(*first->second), x.primary);
      if (!sgd) {
        put(view_of(*marked.at(name + "/exp_avg_sq")), x.second);
        const auto& step = *marked.at(name + "/step");
        std::memcpy(&x.step, step.bytes.data(), std::min(sizeof x.step, step.bytes.size()));
      }
    }
    exact_update(cfg_.optim, opt_->lr(), &x);
    if (sgd && cfg_.optim.momentum == 0) std::fill(x.primary, x.primary + n, 0.0f);  // SGD keeps no buffer then
    put(flat_.params[i].tensor, now->data() + off);
    put(opt_->primary(flat_.params[i].tensor), now->data() + P + off);
  }
  return true;
}

}  // namespace culprit::harness
