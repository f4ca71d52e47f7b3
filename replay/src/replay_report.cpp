// culprit replay's report: the record (JSON, docs/records.md) and its text rendering. Pieces of it
// travel between ranks as JSON too (replay_codec.h), so there is one schema for every use.
#include <algorithm>
#include <stdexcept>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>

#include "culprit/replay.h"
#include "replay_codec.h"

namespace culprit::replay {

using json = nlohmann::ordered_json;

namespace {

constexpr int kReplayVersion = 1;


std::uint32_t bits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
float from_bits(std::uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

std::string ranks_list(const std::vector<int>& v) {
  std::string out;
  for (int r : v) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

}  // namespace

// ---- codecs ----

json to_json(const ShardDifference& d) {
  json j = {{"where", name_of(d.where)}, {"name", d.name}};
  if (d) {
    j["phase"] = name_of(d.phase());
    j["layer"] = d.layer();
  }
  j["got"] = fingerprint_hex(d.got);
  j["want"] = fingerprint_hex(d.want);
  j["got_loss_bits"] = bits(d.got_loss);
  j["want_loss_bits"] = bits(d.want_loss);
  j["detail"] = d.describe();  // for people
  return j;
}

ShardDifference shard_difference_from(const json& j) {
  ShardDifference d;
  if (!parse_name(j.at("where").get<std::string>(), &d.where))
    throw std::runtime_error("unknown place '" + j.at("where").get<std::string>() + "'");
  d.name = j.at("name").get<std::string>();
  d.got = std::stoull(j.at("got").get<std::string>(), nullptr, 16);
  d.want = std::stoull(j.at("want").get<std::string>(), nullptr, 16);
  d.got_loss = from_bits(j.at("got_loss_bits").get<std::uint32_t>());
  d.want_loss = from_bits(j.at("want_loss_bits").get<std::uint32_t>());
  return d;
}

json to_json(const UpdateDifference& d) {
  return json{{"where", name_of(d.where)}, {"param", d.param},        {"owner", d.owner},
              {"got", fingerprint_hex(d.got)}, {"want", fingerprint_hex(d.want)}, {"detail", d.describe()}};
}

json to_json(const PriorStep::Shard& s) {
  return json{{"rank", s.rank},
              {"shard", s.mismatch.shard},
              {"recorded_by", s.mismatch.recorded_by},
              {"recorded_host", s.mismatch.host},
              {"difference", to_json(s.mismatch.diff)}};
}

PriorStep::Shard prior_shard_from(const json& j) {
  PriorStep::Shard s;
  s.rank = j.at("rank").get<int>();
  s.mismatch.shard = j.at("shard").get<int>();
  s.mismatch.recorded_by = j.at("recorded_by").get<int>();
  s.mismatch.host = j.at("recorded_host").get<std::string>();
  s.mismatch.diff = shard_difference_from(j.at("difference"));
  return s;
}

json to_json(const ShardReplay& r, int shard) {
  return json{{"shard", shard},          {"rank", r.rank},
              {"host", r.host},          {"in_trace", r.in_trace},
              {"match", !r.diff && r.in_trace}, {"grad", fingerprint_hex(r.grad_fp)},
              {"difference", to_json(r.diff)}};
}

ShardReplay shard_replay_from(const json& j, int* shard) {
  ShardReplay r;
  *shard = j.at("shard").get<int>();
  r.rank = j.at("rank").get<int>();
  r.host = j.at("host").get<std::string>();
  r.in_trace = j.at("in_trace").get<bool>();
  r.grad_fp = std::stoull(j.at("grad").get<std::string>(), nullptr, 16);
  r.diff = shard_difference_from(j.at("difference"));
  return r;
}

json to_json(const Disagreement& d, int shard) {
  return json{{"shard", shard},           {"rank_a", d.rank_a},     {"rank_b", d.rank_b}, {"element", d.element},
              {"a_bits", bits(d.a)},      {"b_bits", bits(d.b)}};
}

Disagreement disagreement_from(const json& j, int* shard) {
  Disagreement d;
  *shard = j.at("shard").get<int>();
  d.rank_a = j.at("rank_a").get<int>();
  d.rank_b = j.at("rank_b").get<int>();
  d.element = j.at("element").get<std::int64_t>();
  d.a = from_bits(j.at("a_bits").get<std::uint32_t>());
  d.b = from_bits(j.at("b_bits").get<std::uint32_t>());
  return d;
}

std::string encode(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }
json decode(const std::string& line) { return json::parse(line); }

// ---- the report ----

int ShardReport::mismatches() const {
  int n = 0;
  for (const auto& r : replays) n += r.diff || !r.in_trace;
  return n;
}

int ReplayReport::mismatches() const {
  int n = 0;
  for (const auto& p : before) n += static_cast<int>(p.shards.size()) + (p.update ? 1 : 0);
  for (const auto& s : shards) n += s.mismatches();
  return n + (update ? 1 : 0);
}

std::string to_json(const ReplayReport& r) {
  json j = {{"record", "replay"}, {"version", kReplayVersion}, {"run_dir", r.run_dir}, {"step", r.step},
            {"checkpoint", r.checkpoint}, {"world_size", r.world_size}, {"layers_compared", r.layers_compared}};
  j["before"] = json::array();
  for (const auto& p : r.before) {
    json pj = {{"step", p.step}, {"recorded", p.recorded}, {"shards", json::array()}};
    for (const auto& s : p.shards) pj["shards"].push_back(to_json(s));
    pj["update"] = to_json(p.update);
    j["before"].push_back(pj);
  }
  j["shards"] = json::array();
  for (const auto& s : r.shards) {
    json sj = {{"shard", s.shard}, {"recorded", s.recorded}, {"recorded_by", s.recorded_by},
               {"recorded_host", s.recorded_host}, {"recorded_loss_bits", bits(s.recorded_loss)},
               {"recorded_grad", fingerprint_hex(s.recorded_grad)}, {"replays", json::array()}};
    for (const auto& rp : s.replays) sj["replays"].push_back(to_json(rp, s.shard));
    sj["disagreement"] = s.disagreement ? to_json(*s.disagreement, s.shard) : json(nullptr);
    j["shards"].push_back(sj);
  }
  j["update"] = to_json(r.update);
  j["mismatches"] = r.mismatches();
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string text_header(const ReplayReport& r) {
  return "culprit replay: " + r.run_dir + " step " + std::to_string(r.step) + " from " + r.checkpoint + " on " +
         std::to_string(r.world_size) + " rank(s)" + (r.layers_compared ? ", per-layer fingerprints" : "") + "\n";
}

std::string text_prior(const PriorStep& p) {
  std::string out;
  const std::string T = std::to_string(p.step);
  for (const auto& s : p.shards)
    out += "step " + T + " micro-shard " + std::to_string(s.mismatch.shard) + " on rank " + std::to_string(s.rank) +
           ": MISMATCH " + s.mismatch.diff.describe() + " (recorded by rank " + std::to_string(s.mismatch.recorded_by) +
           " on " + s.mismatch.host + ")\n";
  if (p.update) out += "step " + T + " update: MISMATCH " + p.update.describe() + "\n";
  if (!p.recorded) out += "step " + T + ": no trace rows (retired by --trace-keep, or not traced): replayed, not compared\n";
  else if (p.shards.empty() && !p.update) out += "step " + T + ": every micro-shard and the update match\n";
  return out;
}

std::string text_examined(const ReplayReport& r) {
  std::string out;
  auto say = [&](const std::string& line) { out += line + "\n"; };
  const std::string S = std::to_string(r.step);
  for (const auto& s : r.shards) {
    const std::string K = std::to_string(s.shard);
    if (s.recorded)
      say("step " + S + " micro-shard " + K + ", recorded by rank " + std::to_string(s.recorded_by) + " on " +
          s.recorded_host + ": loss " + float_bits(s.recorded_loss) + ", gradient " + fingerprint_hex(s.recorded_grad));
    std::vector<int> same, differ;
    for (const auto& rp : s.replays) {
      const bool bad = rp.diff || !rp.in_trace;
      say("  step " + S + " micro-shard " + K + " on rank " + std::to_string(rp.rank) + " (" + rp.host + "): " +
          (!rp.in_trace ? "MISMATCH not in the trace" : bad ? "MISMATCH " + rp.diff.describe() : "match"));
      (bad ? differ : same).push_back(rp.rank);
    }
    // What the replays say together.
    std::vector<Fingerprint> distinct;
    for (const auto& rp : s.replays)
      if (std::find(distinct.begin(), distinct.end(), rp.grad_fp) == distinct.end()) distinct.push_back(rp.grad_fp);
    const std::string who = s.recorded ? std::to_string(s.recorded_by) : "?";
    if (!differ.empty() && same.empty() && distinct.size() == 1)
      say("  => every replay (ranks " + ranks_list(differ) + ") agrees with the others and not with the record of rank " +
          who);
    else if (!differ.empty() && !same.empty())
      say("  => rank(s) " + ranks_list(same) + " reproduce the record of rank " + who + "; rank(s) " + ranks_list(differ) +
          " do not");
  }
  for (const auto& s : r.shards)
    if (const auto& d = s.disagreement)
      say("  replays disagree: micro-shard " + std::to_string(s.shard) + " gradient element " + std::to_string(d->element) +
          ": rank " + std::to_string(d->rank_a) + " " + float_bits(d->a) + ", rank " + std::to_string(d->rank_b) + " " +
          float_bits(d->b) + ", bits " + [&] {
            char buf[16];
            std::snprintf(buf, sizeof buf, "0x%08x", bits(d->a) ^ bits(d->b));
            return std::string(buf);
          }() + " differ");
  say("step " + S + " update: " + (r.update ? "MISMATCH " + r.update.describe() : "match"));
  if (r.mismatches() == 0) say("replay of step " + S + ": everything matches the trace");
  return out;
}

std::string to_text(const ReplayReport& r) {
  std::string out = text_header(r);
  for (const auto& p : r.before) out += text_prior(p);
  return out + text_examined(r);
}

}  // namespace culprit::replay
