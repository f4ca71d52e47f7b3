// Private to harness/model: what the built-in models share (models.cpp's plain ones, tp_gpt.cpp's
// tensor-parallel gpt): Linear as PyTorch eager computes it, gpt's modules (the state dict both
// forms share), the nn::Module plumbing, GPT-2's initialisation.
#pragma once
#include <torch/torch.h>

#include <cmath>

#include "culprit/model.h"

namespace culprit::harness {

// A Linear layer as PyTorch eager computes it (at::linear: one addmm for 2-D and contiguous 3-D
// inputs). The C++ frontend's Linear::forward is an implementation of its own (matmul, then += bias
// for 3-D inputs), which under bf16 autocast rounds differently from PyTorch.
inline at::Tensor linear(const torch::nn::Linear& l, const at::Tensor& x) { return torch::linear(x, l->weight, l->bias); }

// ---- gpt: a tiny decoder-only transformer with dropout ---------------------------------------
struct AttnNet : torch::nn::Module {
  AttnNet(std::int64_t d)
      : qkv(register_module("qkv", torch::nn::Linear(d, 3 * d))),
        proj(register_module("proj", torch::nn::Linear(d, d))) {}
  torch::nn::Linear qkv, proj;
};
struct MlpBlockNet : torch::nn::Module {
  MlpBlockNet(std::int64_t d)
      : fc(register_module("fc", torch::nn::Linear(d, 4 * d))),
        proj(register_module("proj", torch::nn::Linear(4 * d, d))) {}
  torch::nn::Linear fc, proj;
};
struct BlockNet : torch::nn::Module {
  BlockNet(std::int64_t d)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        attn(register_module("attn", std::make_shared<AttnNet>(d))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        mlp(register_module("mlp", std::make_shared<MlpBlockNet>(d))) {}
  torch::nn::LayerNorm ln1;
  std::shared_ptr<AttnNet> attn;
  torch::nn::LayerNorm ln2;
  std::shared_ptr<MlpBlockNet> mlp;
};
struct GptNet : torch::nn::Module {
  GptNet(std::int64_t vocab, std::int64_t ctx, const GptOptions& g)
      : tok_emb(register_module("tok_emb", torch::nn::Embedding(vocab, g.width))),
        pos_emb(register_module("pos_emb", torch::nn::Embedding(ctx, g.width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({g.width})))) {
    // A tied head has no tensor of its own: registering tok_emb's weight twice would list it twice
    // among the parameters (libtorch, unlike PyTorch, does not drop the duplicate).
    if (!g.tie_head) head = register_module("head", torch::nn::Linear(g.width, vocab));
    for (int i = 0; i < g.layers; ++i) blocks->push_back(std::make_shared<BlockNet>(g.width));
  }
  torch::nn::Embedding tok_emb, pos_emb;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head{nullptr};
};

// Shared plumbing for nn::Module based models.
class BuiltinModel : public Model {
 public:
  std::vector<NamedTensor> parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& item : module()->named_parameters(true)) out.push_back({item.key(), item.value()});
    return out;
  }
  std::vector<NamedTensor> buffers() override {
    std::vector<NamedTensor> out;
    for (const auto& item : module()->named_buffers(true)) out.push_back({item.key(), item.value()});
    return out;
  }
  void set_training(bool on) override { module()->train(on); }

 protected:
  virtual torch::nn::Module* module() = 0;
};

// GPT-2's initialisation, in state-dict order from the seeded generator.
inline void init_gpt2(torch::nn::Module& net, int layers) {
  torch::NoGradGuard ng;
  const double residual = 0.02 / std::sqrt(2.0 * layers);
  for (auto& item : net.named_parameters(true)) {
    const std::string& name = item.key();
    auto& t = item.value();
    const bool proj = name.size() > 12 && name.compare(name.size() - 12, 12, ".proj.weight") == 0;
    if (t.dim() >= 2) t.normal_(0.0, proj ? residual : 0.02);
    else if (name.compare(name.size() - 5, 5, ".bias") == 0) t.zero_();
  }
}

// gpt's dropout probability (embeddings, attention, residual branches).
inline constexpr double kGptDropout = 0.1;

// What both gpt forms are besides their blocks' forward: the modules (one state dict), the
// initialisation, the embeddings, the final norm and head, the tied head's borrowed table.
class GptModel : public BuiltinModel {
 public:
  GptModel(std::int64_t vocab, std::int64_t ctx, const GptOptions& g) : g_(g), net_(std::make_shared<GptNet>(vocab, ctx, g)) {
    for (int i = 0; i < g.layers; ++i) blocks_.push_back(net_->blocks->ptr<BlockNet>(i));
    if (g.init == GptInit::kGpt2) init_gpt2(*net_, g.layers);
  }
  std::vector<std::string> layers() const override { return names_; }
  std::vector<std::string> embeddings() const override { return {"tok_emb.weight", "pos_emb.weight"}; }
  std::vector<std::pair<std::string, std::string>> borrowed() const override {
    if (g_.tie_head) return {{"head", "tok_emb.weight"}};
    return {};
  }

 protected:
  torch::nn::Module* module() override { return net_.get(); }
  // ln_f, then the head: a Linear of its own, or (--tie-head) tok_emb's weight without a bias.
  at::Tensor head(const at::Tensor& x) {
    auto h = call("ln_f", [&] { return net_->ln_f(x); });
    return call("head", [&] { return g_.tie_head ? torch::linear(h, net_->tok_emb->weight) : linear(net_->head, h); });
  }
  const GptOptions g_;
  std::shared_ptr<GptNet> net_;
  std::vector<std::shared_ptr<BlockNet>> blocks_;
  std::vector<std::string> names_;  // the layers, in forward order: the subclass's
};

// The tensor-parallel gpt (tp_gpt.cpp): gpt's modules, computed in `chunks` chunks.
std::unique_ptr<Model> make_tp_gpt(std::int64_t vocab, std::int64_t ctx, const GptOptions& g, int chunks);

}  // namespace culprit::harness
