// The pieces of culprit replay's report as JSON (the record's own schema, docs/records.md): how a
// rank's findings travel to rank 0. Private to culprit_replay.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "culprit/replay.h"

namespace culprit::replay {

nlohmann::ordered_json to_json(const ShardDifference& d);
ShardDifference shard_difference_from(const nlohmann::ordered_json& j);
nlohmann::ordered_json to_json(const UpdateDifference& d);
nlohmann::ordered_json to_json(const PriorStep::Shard& s);
PriorStep::Shard prior_shard_from(const nlohmann::ordered_json& j);
nlohmann::ordered_json to_json(const ShardReplay& r, int shard);
ShardReplay shard_replay_from(const nlohmann::ordered_json& j, int* shard);
nlohmann::ordered_json to_json(const Disagreement& d, int shard);
Disagreement disagreement_from(const nlohmann::ordered_json& j, int* shard);

// The text report in the order it is found: the header, each step before the examined one, the
// examined step (to_text is the three together).
std::string text_header(const ReplayReport& r);
std::string text_prior(const PriorStep& p);
std::string text_examined(const ReplayReport& r);

// One JSON value as one line, and back.
std::string encode(const nlohmann::ordered_json& j);
nlohmann::ordered_json decode(const std::string& line);

}  // namespace culprit::replay
