// gpt's tensor-parallel form (--tp-chunks C, --tensor-parallel T): Megatron's layout with the same
// bits at every T. Every sum that crosses shards is cut into C fixed chunks, C independent of T,
// and the C partial sums are added in one fixed tree (docs/determinism.md, "Tensor parallelism"):
//   - attention's qkv and the MLP's fc are column-parallel: chunk c computes heads
//     [c H/C, (c+1) H/C) and hidden units [c 4d/C, (c+1) 4d/C); their input gradient is the
//     tree's sum of the C chunks' partial input gradients;
//   - attention's proj and the MLP's proj are row-parallel: chunk c multiplies its own features,
//     and the output is the tree's sum of the C partial products (plus the bias);
//   - embeddings, layer norms and the head are replicated: every rank of a group computes them
//     on the same bits.
// A rank computes its C / T chunks one by one, in the shapes T = 1 computes each chunk in, so a
// chunk's bits do not depend on who computes it; the partials travel whole (an all-gather in the
// group) and every rank adds the same C values in the same tree. Dropout masks are drawn whole by
// every rank from the micro-shard's generator, so T never changes which numbers it draws.
// The column- and row-parallel products are autograd Functions with their backward written out:
// each parameter's gradient is assembled by copying chunks into zeros (autograd's accumulation of
// sliced gradients would add +0.0 to a -0.0 at T = 1 but not at T = C), and each cross-chunk sum
// is the fixed tree rather than autograd's order of arrival.
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "culprit/watchdog.h"
#include "model/builtin.h"

namespace culprit::harness {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

// The ranks that share a micro-shard, and the chunks this one computes.
struct TensorGroup {
  Comm comm;  // size 1: every chunk here (no exchange)
  int chunks = 1;
  int first() const { return comm.rank * (chunks / comm.size); }
  int owned() const { return chunks / comm.size; }
};

const TensorGroup& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<const TensorGroup*>(ctx->saved_data["group"].toInt());
}
std::int64_t group_arg(const TensorGroup& g) { return reinterpret_cast<std::int64_t>(&g); }

// ((p0 + p1) + (p2 + p3)) ...: the fixed tree over chunks [lo, hi), the left half the smaller.
at::Tensor tree(const std::vector<at::Tensor>& parts, std::size_t lo, std::size_t hi) {
  if (hi - lo == 1) return parts[lo];
  const std::size_t mid = lo + (hi - lo) / 2;
  return tree(parts, lo, mid) + tree(parts, mid, hi);
}

// Which exchange a sum is: its layer, its direction, and who observes it (model.h: on_exchange).
struct Exchange {
  std::string layer;
  bool backward = false;
  LayerObserver* observer = nullptr;
};
Exchange exchange_of(AutogradContext* ctx, bool backward) {
  return {ctx->saved_data["layer"].toStringRef(), backward,
          reinterpret_cast<LayerObserver*>(ctx->saved_data["observer"].toInt())};
}

// The observer sees every chunk's part, this rank's as computed and the others' as they arrived.
void observe(const TensorGroup& g, const Exchange& x, std::vector<at::Tensor>& parts) {
  if (!x.observer) return;
  const int owned = g.owned();
  for (int c = 0; c < g.chunks; ++c)
    x.observer->on_exchange(x.layer, c, c / owned, x.backward, c / owned == g.comm.rank, parts[static_cast<std::size_t>(c)]);
}

// The sum over all C chunks of a partial that each rank holds for its own chunks (in chunk order):
// gathered whole in the group, then the tree. Collective within the group.
at::Tensor chunk_sum(const TensorGroup& g, const Exchange& x, std::vector<at::Tensor> mine) {
  if (g.comm.size == 1) {
    observe(g, x, mine);
    return tree(mine, 0, mine.size());
  }
  const at::Tensor send = at::stack(mine).contiguous();
  std::vector<std::int64_t> shape = send.sizes().vec();
  shape[0] = g.chunks;
  at::Tensor all = at::empty(shape, send.options());
  const auto n = send.numel();
  if (n > std::numeric_limits<int>::max())
    throw std::runtime_error("a tensor-parallel partial sum holds more than 2^31 values");
  CULPRIT_COLLECTIVE(g.comm, "the tensor-parallel exchange",
                     MPI_Iallgather(send.data_ptr<float>(), static_cast<int>(n), MPI_FLOAT, all.data_ptr<float>(),
                                    static_cast<int>(n), MPI_FLOAT, g.comm.comm, &_culprit_req));
  std::vector<at::Tensor> parts = all.unbind(0);
  observe(g, x, parts);
  return tree(parts, 0, parts.size());
}

// Chunk c of a parameter cut along dim 0 in `groups` parts (qkv: q, k, v), contiguous.
at::Tensor rows(const at::Tensor& t, int c, int chunks, int groups) {
  const std::int64_t per_group = t.size(0) / groups, n = per_group / chunks;
  if (groups == 1) return t.narrow(0, c * n, n);
  std::vector<at::Tensor> parts;
  for (int j = 0; j < groups; ++j) parts.push_back(t.narrow(0, j * per_group + c * n, n));
  return at::cat(parts, 0);
}
void put_rows(at::Tensor& t, int c, int chunks, int groups, const at::Tensor& v) {
  const std::int64_t per_group = t.size(0) / groups, n = per_group / chunks;
  for (int j = 0; j < groups; ++j) t.narrow(0, j * per_group + c * n, n).copy_(v.narrow(0, j * n, n));
}
// Chunk c of a parameter cut along dim 1 (a row-parallel weight's input features), contiguous.
at::Tensor cols(const at::Tensor& t, int c, int chunks) {
  const std::int64_t n = t.size(1) / chunks;
  return t.narrow(1, c * n, n).contiguous();
}

// Column-parallel: this rank's chunks of linear(h, W, b), W cut along its outputs.
struct ColumnParallel : torch::autograd::Function<ColumnParallel> {
  static variable_list forward(AutogradContext* ctx, Variable h, Variable w, Variable b, std::int64_t groups,
                               std::int64_t group, const std::string& layer, std::int64_t observer) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["observer"] = observer;
    ctx->saved_data["groups"] = groups;
    ctx->save_for_backward({h, w});
    const TensorGroup& g = *reinterpret_cast<const TensorGroup*>(group);
    variable_list out;
    for (int j = 0; j < g.owned(); ++j) {
      const int c = g.first() + j, G = static_cast<int>(groups);
      out.push_back(at::linear(h, rows(w, c, g.chunks, G), rows(b, c, g.chunks, G)));
    }
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const TensorGroup& g = group_of(ctx);
    const int G = static_cast<int>(ctx->saved_data["groups"].toInt());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& h = saved[0];
    const at::Tensor& w = saved[1];
    const std::int64_t d = h.size(-1), oc = w.size(0) / g.chunks;
    const at::Tensor h2 = h.reshape({-1, d});
    at::Tensor dw = at::zeros_like(w), db = at::zeros({w.size(0)}, w.options());
    std::vector<at::Tensor> dh;
    for (int j = 0; j < g.owned(); ++j) {
      const int c = g.first() + j;
      std::vector<std::int64_t> shape = h.sizes().vec();
      shape.back() = oc;
      const at::Tensor dy = grads[j].defined() ? grads[j] : at::zeros(shape, h.options());
      const at::Tensor dy2 = dy.reshape({-1, oc});
      dh.push_back(dy.matmul(rows(w, c, g.chunks, G)));
      put_rows(dw, c, g.chunks, G, dy2.t().mm(h2));
      put_rows(db, c, g.chunks, G, dy2.sum(0));
    }
    return {chunk_sum(g, exchange_of(ctx, true), dh), dw, db, Variable(), Variable(), Variable(), Variable()};
  }
};

// Row-parallel, its partial products: chunk c's features ys[c] times W's columns of chunk c.
struct RowPartials : torch::autograd::Function<RowPartials> {
  static variable_list forward(AutogradContext* ctx, at::TensorList ys, Variable w, std::int64_t group) {
    ctx->saved_data["group"] = group;
    variable_list keep(ys.begin(), ys.end());
    keep.push_back(w);
    ctx->save_for_backward(keep);
    const TensorGroup& g = *reinterpret_cast<const TensorGroup*>(group);
    variable_list out;
    for (int j = 0; j < g.owned(); ++j) out.push_back(at::linear(ys[j], cols(w, g.first() + j, g.chunks)));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const TensorGroup& g = group_of(ctx);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& w = saved.back();
    const std::int64_t d = w.size(0), ic = w.size(1) / g.chunks;
    at::Tensor dw = at::zeros_like(w);
    variable_list out;
    for (int j = 0; j < g.owned(); ++j) {
      const int c = g.first() + j;
      const at::Tensor& y = saved[j];
      std::vector<std::int64_t> shape = y.sizes().vec();
      shape.back() = d;
      const at::Tensor dp = grads[j].defined() ? grads[j] : at::zeros(shape, y.options());
      out.push_back(dp.matmul(cols(w, c, g.chunks)));
      dw.narrow(1, c * ic, ic).copy_(dp.reshape({-1, d}).t().mm(y.reshape({-1, ic})));
    }
    out.push_back(dw);
    out.push_back(Variable());
    return out;
  }
};

// Row-parallel, the sum: the tree over all C partial products (every rank of the group the same).
struct ChunkSum : torch::autograd::Function<ChunkSum> {
  static Variable forward(AutogradContext* ctx, at::TensorList partials, std::int64_t group, const std::string& layer,
                          std::int64_t observer) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["observer"] = observer;
    ctx->saved_data["n"] = static_cast<std::int64_t>(partials.size());
    const TensorGroup& g = *reinterpret_cast<const TensorGroup*>(group);
    return chunk_sum(g, exchange_of(ctx, false), std::vector<at::Tensor>(partials.begin(), partials.end()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(static_cast<std::size_t>(ctx->saved_data["n"].toInt()), grads[0]);
    out.insert(out.end(), {Variable(), Variable(), Variable()});
    return out;
  }
};

// Dropout with a mask drawn whole (every rank draws every chunk's), as at::dropout draws it: keep
// with probability 1 - p, scaled by 1 / (1 - p).
at::Tensor keep_mask(at::IntArrayRef shape) {
  at::Tensor m = at::empty(shape, at::kFloat).bernoulli_(1 - kGptDropout);
  return m.div_(1 - kGptDropout);
}

class TpGpt : public GptModel {
 public:
  TpGpt(std::int64_t vocab, std::int64_t ctx, const GptOptions& g, int chunks) : GptModel(vocab, ctx, g) {
    group_.chunks = chunks;
    names_ = {"tok_emb", "pos_emb"};
    const auto per_chunk = [&](const std::string& l) {
      for (int c = 0; c < chunks; ++c) names_.push_back(chunk_name(l, c));
    };
    // A column-parallel layer's partial input gradients (backward slots only, LayerTrace::on_exchange),
    // before its chunks: the backward pass computes them after the chunks' output gradients.
    const auto column_chunks = [&](const std::string& l) {
      for (int c = 0; c < chunks; ++c) names_.push_back(l + ".dx[" + std::to_string(c) + "]");
      per_chunk(l);
    };
    for (int i = 0; i < g.layers; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      names_.push_back(b + "ln1");
      column_chunks(b + "attn.qkv");
      per_chunk(b + "attn.proj");
      names_.push_back(b + "attn.proj");
      names_.push_back(b + "ln2");
      column_chunks(b + "mlp.fc");
      per_chunk(b + "mlp.proj");
      names_.push_back(b + "mlp.proj");
    }
    names_.push_back("ln_f");
    names_.push_back("head");
  }
  // A chunk's layer: its name, then the chunk in brackets (blocks.0.mlp.fc[2]).
  static std::string chunk_name(const std::string& layer, int c) { return layer + "[" + std::to_string(c) + "]"; }

  void set_tensor_group(const Comm& group) override { group_.comm = group; }
  int chunks() const override { return group_.chunks; }
  std::vector<TensorSplit> tensor_splits() const override {
    std::vector<TensorSplit> out;
    for (int i = 0; i < g_.layers; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      out.push_back({b + "attn.qkv.weight", 0, 3});
      out.push_back({b + "attn.qkv.bias", 0, 3});
      out.push_back({b + "attn.proj.weight", 1, 1});
      out.push_back({b + "mlp.fc.weight", 0, 1});
      out.push_back({b + "mlp.fc.bias", 0, 1});
      out.push_back({b + "mlp.proj.weight", 1, 1});
    }
    return out;
  }

  at::Tensor forward(const at::Tensor& idx) override {
    const bool train = net_->is_training();
    const std::int64_t n = idx.size(0), t = idx.size(1), heads = g_.heads, hd = g_.width / heads;
    const std::int64_t hc = heads / group_.chunks;
    auto pos = torch::arange(t, torch::kLong);
    auto x = call("tok_emb", [&] { return net_->tok_emb(idx); }) + call("pos_emb", [&] { return net_->pos_emb(pos); });
    x = dropout(x, train);
    auto mask = torch::ones({t, t}, torch::kBool).triu(1);
    for (int i = 0; i < g_.layers; ++i) {
      const auto& blk = blocks_[i];
      const std::string b = "blocks." + std::to_string(i) + ".";
      auto h = call(b + "ln1", [&] { return blk->ln1(x); });
      // The layer's attention mask, whole: the same draws whichever heads this rank computes.
      const at::Tensor att_keep = train ? keep_mask({n, heads, t, t}) : at::Tensor();
      const variable_list qkv = column(b + "attn.qkv", h, blk->attn->qkv, 3);
      std::vector<at::Tensor> ys;
      for (int j = 0; j < group_.owned(); ++j) {
        const int c = group_.first() + j;
        auto p = qkv[j].view({n, t, 3, hc, hd}).permute({2, 0, 3, 1, 4});
        auto att = torch::matmul(p[0], p[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
        att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
        if (train) att = att * att_keep.narrow(1, c * hc, hc);
        ys.push_back(torch::matmul(att, p[2]).transpose(1, 2).contiguous().view({n, t, hc * hd}));
      }
      x = x + dropout(row(b + "attn.proj", ys, blk->attn->proj), train);
      h = call(b + "ln2", [&] { return blk->ln2(x); });
      variable_list f = column(b + "mlp.fc", h, blk->mlp->fc, 1);
      for (auto& v : f) v = torch::gelu(v);
      x = x + dropout(row(b + "mlp.proj", f, blk->mlp->proj), train);
    }
    return head(x);
  }

 private:
  std::int64_t observer_arg() const { return reinterpret_cast<std::int64_t>(observer_); }
  static at::Tensor dropout(const at::Tensor& x, bool train) { return train ? x * keep_mask(x.sizes()) : x; }
  // This rank's chunks of a column-parallel layer, each one a layer of its own (LayerTrace).
  variable_list column(const std::string& layer, const at::Tensor& h, const torch::nn::Linear& l, int groups) {
    for (int j = 0; j < group_.owned(); ++j) enter(chunk_name(layer, group_.first() + j));
    variable_list out = ColumnParallel::apply(h, l->weight, l->bias, groups, group_arg(group_), layer, observer_arg());
    for (int j = 0; j < group_.owned(); ++j) out[j] = tap(chunk_name(layer, group_.first() + j), out[j]);
    return out;
  }
  // A row-parallel layer: this rank's partial products (a layer each), then their sum and the bias
  // (the layer itself, the same on every rank of the group).
  at::Tensor row(const std::string& layer, const std::vector<at::Tensor>& ys, const torch::nn::Linear& l) {
    for (int j = 0; j < group_.owned(); ++j) enter(chunk_name(layer, group_.first() + j));
    variable_list parts = RowPartials::apply(at::TensorList(ys), l->weight, group_arg(group_));
    for (int j = 0; j < group_.owned(); ++j) parts[j] = tap(chunk_name(layer, group_.first() + j), parts[j]);
    enter(layer);
    return tap(layer, ChunkSum::apply(at::TensorList(parts), group_arg(group_), layer, observer_arg()) + l->bias);
  }

  TensorGroup group_;
};

}  // namespace

std::unique_ptr<Model> make_tp_gpt(std::int64_t vocab, std::int64_t ctx, const GptOptions& g, int chunks) {
  return std::make_unique<TpGpt>(vocab, ctx, g, chunks);
}

}  // namespace culprit::harness
