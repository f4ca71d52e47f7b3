// Built-in models (mlp, cnn, gpt) and TorchScript modules.
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>

#include "culprit/external.h"
#include "culprit/error_line.h"
#include "culprit/model.h"
#include "config/sizes.h"
#include "model/builtin.h"

namespace culprit::harness {

namespace F = torch::nn::functional;

namespace {

// Output width: number of classes, or the target size for regression.
std::int64_t out_features(const Dataset& d) { return d.classification() ? d.classes : d.y_numel(); }

// ---- mlp: fc1 -> relu -> fc2 -> relu -> fc3 -------------------------------------------------
struct MlpNet : torch::nn::Module {
  MlpNet(std::int64_t in, std::int64_t hidden, std::int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}
  torch::nn::Linear fc1, fc2, fc3;
};

// ---- cnn: conv1 -> relu -> pool -> conv2 -> relu -> pool -> fc --------------------------------
struct CnnNet : torch::nn::Module {
  CnnNet(std::int64_t cin, std::int64_t h, std::int64_t w, std::int64_t out)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(cin, 8, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(16 * (h / 4) * (w / 4), out))) {}
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};

class Mlp : public BuiltinModel {
 public:
  Mlp(std::int64_t in, std::int64_t hidden, std::int64_t out) : net_(std::make_shared<MlpNet>(in, hidden, out)) {}
  at::Tensor forward(const at::Tensor& x) override {
    auto h = call("fc1", [&] { return linear(net_->fc1, x.flatten(1)); });
    h = call("fc2", [&] { return linear(net_->fc2, torch::relu(h)); });
    return call("fc3", [&] { return linear(net_->fc3, torch::relu(h)); });
  }
  std::vector<std::string> layers() const override { return {"fc1", "fc2", "fc3"}; }

 private:
  torch::nn::Module* module() override { return net_.get(); }
  std::shared_ptr<MlpNet> net_;
};

class Cnn : public BuiltinModel {
 public:
  Cnn(std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t out)
      : net_(std::make_shared<CnnNet>(c, h, w, out)) {}
  at::Tensor forward(const at::Tensor& x) override {
    auto h = call("conv1", [&] { return net_->conv1(x); });
    h = torch::max_pool2d(torch::relu(h), 2);
    h = call("conv2", [&] { return net_->conv2(h); });
    h = torch::max_pool2d(torch::relu(h), 2);
    return call("fc", [&] { return linear(net_->fc, h.flatten(1)); });
  }
  std::vector<std::string> layers() const override { return {"conv1", "conv2", "fc"}; }

 private:
  torch::nn::Module* module() override { return net_.get(); }
  std::shared_ptr<CnnNet> net_;
};

// Pre-LN blocks: x + attn(ln1(x)), then x + mlp(ln2(x)) with a GELU MLP; the head is a Linear of
// its own or (--tie-head) tok_emb's weight without a bias.
class Gpt : public GptModel {
 public:
  static constexpr double kDropout = kGptDropout;
  Gpt(std::int64_t vocab, std::int64_t ctx, const GptOptions& g) : GptModel(vocab, ctx, g) {
    names_ = {"tok_emb", "pos_emb"};
    for (int i = 0; i < g.layers; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      for (const char* l : {"ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc", "mlp.proj"}) names_.push_back(b + l);
    }
    names_.push_back("ln_f");
    names_.push_back("head");
  }
  at::Tensor forward(const at::Tensor& idx) override {
    const bool train = net_->is_training();
    const std::int64_t n = idx.size(0), t = idx.size(1), d = g_.width, heads = g_.heads, hd = d / heads;
    auto pos = torch::arange(t, torch::kLong);
    auto x = call("tok_emb", [&] { return net_->tok_emb(idx); }) + call("pos_emb", [&] { return net_->pos_emb(pos); });
    x = torch::dropout(x, kDropout, train);
    auto mask = torch::ones({t, t}, torch::kBool).triu(1);
    for (int i = 0; i < g_.layers; ++i) {
      const auto& blk = blocks_[i];
      const std::string b = "blocks." + std::to_string(i) + ".";
      auto h = call(b + "ln1", [&] { return blk->ln1(x); });
      auto qkv = call(b + "attn.qkv", [&] { return linear(blk->attn->qkv, h); }).view({n, t, 3, heads, hd}).permute({2, 0, 3, 1, 4});
      auto q = qkv[0], k = qkv[1], v = qkv[2];
      auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
      att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
      att = torch::dropout(att, kDropout, train);
      auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({n, t, d});
      x = x + torch::dropout(call(b + "attn.proj", [&] { return linear(blk->attn->proj, y); }), kDropout, train);
      h = call(b + "ln2", [&] { return blk->ln2(x); });
      h = torch::gelu(call(b + "mlp.fc", [&] { return linear(blk->mlp->fc, h); }));
      x = x + torch::dropout(call(b + "mlp.proj", [&] { return linear(blk->mlp->proj, h); }), kDropout, train);
    }
    return head(x);
  }
};

// ---- TorchScript ----------------------------------------------------------------------------
class Scripted : public Model {
 public:
  explicit Scripted(torch::jit::Module m) : m_(std::move(m)) {}
  at::Tensor forward(const at::Tensor& x) override {
    enter(kOutputLayer);
    auto out = m_.forward({x});
    if (!out.isTensor()) throw std::runtime_error("TorchScript forward must return one tensor");
    return tap(kOutputLayer, out.toTensor());
  }
  std::vector<NamedTensor> parameters() override {
    std::vector<NamedTensor> out;
    for (const auto& p : m_.named_parameters(true)) out.push_back({p.name, p.value});
    return out;
  }
  std::vector<NamedTensor> buffers() override {
    std::vector<NamedTensor> out;
    for (const auto& p : m_.named_buffers(true)) out.push_back({p.name, p.value});
    return out;
  }
  void set_training(bool on) override { m_.train(on); }
  // The weights of the module's Embedding and EmbeddingBag submodules (by their class name).
  std::vector<std::string> embeddings() const override {
    std::vector<std::string> out;
    for (const auto& sub : m_.named_modules()) {
      const auto& type = sub.value.type();
      if (!type->name()) continue;
      const std::string cls = type->name()->name();
      if (cls != "Embedding" && cls != "EmbeddingBag") continue;
      for (const auto& p : sub.value.named_parameters(/*recurse=*/false))
        out.push_back(sub.name.empty() ? p.name : sub.name + "." + p.name);
    }
    return out;
  }
  // The module's forward is opaque: its output is the one observable layer.
  std::vector<std::string> layers() const override { return {kOutputLayer}; }
  bool per_layer() const override { return false; }

 private:
  torch::jit::Module m_;
};

Status need_float_samples(const std::string& model, const Dataset& d) {
  if (d.x_dtype != DType::kFloat32)
    return Status::BadInput("model " + model + " needs float32 samples, data x holds " + dtype_name(d.x_dtype));
  return Status::OK();
}

}  // namespace

Status make_model(const TrainConfig& cfg, const Dataset& d, std::unique_ptr<Model>* out, int world) {
  torch::manual_seed(cfg.seed);
  const std::string m = cfg.model.text();
  const ModelKind kind = cfg.model.kind;
  if (kind == ModelKind::kMlp) {
    CULPRIT_RETURN_IF_ERROR(need_float_samples(m, d));
    CULPRIT_RETURN_IF_ERROR(check_model_size(cfg, d.x_shape, out_features(d), world));
    *out = std::make_unique<Mlp>(d.x_numel(), cfg.hidden, out_features(d));
  } else if (kind == ModelKind::kCnn) {
    CULPRIT_RETURN_IF_ERROR(need_float_samples(m, d));
    const auto& s = d.x_shape;
    if (s.size() != 3 || s[1] < 4 || s[2] < 4 || s[1] % 4 || s[2] % 4)
      return Status::BadInput("model cnn needs samples of shape [C,H,W] with H and W multiples of 4, data x has " +
                           shape_str(s));
    CULPRIT_RETURN_IF_ERROR(check_model_size(cfg, s, out_features(d), world));
    *out = std::make_unique<Cnn>(s[0], s[1], s[2], out_features(d));
  } else if (kind == ModelKind::kGpt) {
    if (d.x_dtype != DType::kInt64 || d.x_shape.size() != 1)
      return Status::BadInput("model gpt needs int64 token sequences of shape [T], data x has " +
                           std::string(dtype_name(d.x_dtype)) + " " + shape_str(d.x_shape));
    if (!d.classification() || d.y_shape != d.x_shape)
      return Status::BadInput("model gpt needs int64 next-token targets of the shape of x " + shape_str(d.x_shape) +
                           ", data y has " + dtype_name(d.y_dtype) + " " + shape_str(d.y_shape));
    if (cfg.gpt.seq_len > 0 && cfg.gpt.seq_len != d.x_shape[0])
      return Status::BadInput("option '--seq-len' is " + std::to_string(cfg.gpt.seq_len) + " but data " +
                              cfg.data.text() + " holds sequences of " + std::to_string(d.x_shape[0]) + " tokens");
    // The vocabulary: --vocab when given (the data's open checked every token against it), else
    // wide enough for every token and target (load_dataset).
    const std::int64_t vocab = d.classes;
    CULPRIT_RETURN_IF_ERROR(check_model_size(cfg, d.x_shape, vocab, world));
    if (cfg.chunked()) *out = make_tp_gpt(vocab, d.x_shape[0], cfg.gpt, cfg.tp_chunks);
    else *out = std::make_unique<Gpt>(vocab, d.x_shape[0], cfg.gpt);
  } else if (cfg.model.kind == ModelKind::kPython) {
    const ExternalSource* ext = external_source();
    CULPRIT_RETURN_IF_ERROR(ext ? ext->make_model(cfg, d, out) : no_external_source("model " + m));
  } else {
    const std::string& path = cfg.model.path;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return Status::BadInput("TorchScript file '" + path + "' does not exist");
    try {
      *out = std::make_unique<Scripted>(torch::jit::load(path));
    } catch (const std::exception& e) {
      return Status::BadInput("cannot load TorchScript module '" + path + "': " + error_line(e.what()));
    }
  }
  for (auto& p : (*out)->parameters()) {
    if (p.tensor.scalar_type() != torch::kFloat32)
      return Status::BadInput("model " + m + ": parameter '" + p.name + "' is " +
                           std::string(c10::toString(p.tensor.scalar_type())) +
                           "; culprit trains float32 parameters");
    p.tensor.requires_grad_(true);
  }
  if ((*out)->parameters().empty()) return Status::BadInput("model " + m + " has no parameters to train");
  return Status::OK();
}

}  // namespace culprit::harness
