// The bisection's actions: one function per state of machine.h, each filling the Finding and the
// state's Evidence (the same on every rank: every decision is taken from agreed data). Private to
// culprit_bisect.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "culprit/bisect.h"
#include "culprit/watchdog.h"
#include "culprit/compare.h"
#include "culprit/engine.h"
#include "culprit/records.h"
#include "machine.h"

namespace culprit::bisect {

using harness::ShardResult;
using harness::StepResult;
using replay::Schema;

// The report's step x layer map of the replay: rows in execution order (input, each layer's forward
// output, each layer's backward gradient from the last layer to the first, the gradient leaf, the
// update); a cell is 1 where the replay differs from the record.
struct LayerMap {
  std::vector<std::string> rows;
  std::vector<std::int64_t> steps;
  std::vector<std::vector<int>> cells;
};

// What the bisection works with: the run, its first fault-showing incident, the replay engine.
struct Context {
  Context(const Options& o, const Comm& c, records::Diagnosis* diag) : opt(o), comm(c), d(diag) {}
  const Options& opt;
  const Comm& comm;
  records::Diagnosis* d;  // evidence, counts and timings, as they are found
  replay::RunRecord run;
  std::vector<records::Incident> incidents;
  const records::Incident* first = nullptr;  // into `incidents`; null: no incident
  // The search's plan: from the newest checkpoint before the first incident (or the oldest) to the
  // end of the trace; then, when nothing was found and it did not start there, from the oldest
  // checkpoint up to where the first part started. `segment` is the part being searched.
  int segment = 0;
  std::int64_t start = 0;         // the step the first part started from
  std::int64_t oldest = -1;       // the oldest start of a part searched (-1: none yet)
  bool reached_oldest = false;    // a part started from the run's oldest valid checkpoint
  // Rank 0, once the search is over: the checkpoints before `oldest`, each damaged (every one was
  // tried before it), with why: the reason steps before `oldest` could not be replayed.
  std::vector<std::string> damaged_before;
  std::vector<records::StepRange> examined;  // steps replayed, in order
  std::int64_t stopped_at = -1;   // a step the search gave up on (its replays kept disagreeing)
  std::map<std::int64_t, int> redone;  // steps redone after a fault in the bisection's own replay
  std::int64_t incident_refuted = -1;  // the comm incident's step, once the record there proved healthy
  bool searching_back = false;    // the search before the start after a recurring finding (bisect.cpp)

  bool layer = false;    // the trace holds per-layer fingerprints
  bool opt_recorded = false;  // the trace holds the optimizer state's fingerprints (format 3)
  int W = 1, M = 1;      // this world; the run's micro-shards
  std::unique_ptr<harness::Engine> engine;
  Schema schema;
  LayerMap map;
  std::string checkpoint;  // where the replay started
  int round = 0;           // draws of intermittent faults so far: a redone step draws anew

  void note(const std::string& line);  // evidence, and a progress line on rank 0
  // The replay of rank r computed step s wrongly during the bisection (its device is suspect too).
  void replay_fault(std::int64_t s, int r, const std::string& what);
  // Step s is redone: its next replay draws intermittent faults anew.
  void redo(std::int64_t s);
  // The blamed rank r is not part of this world: its device was not rerun.
  void note_outside(int r);
  // What an update leaves, as compared: every parameter's fingerprint, then (when the trace has
  // them) every parameter's optimizer state's. Index i names params[i mod P].
  std::vector<Fingerprint> update_state(const std::vector<Fingerprint>& params, const std::vector<Fingerprint>& opt) const {
    std::vector<Fingerprint> v = params;
    if (opt_recorded) v.insert(v.end(), opt.begin(), opt.end());
    return v;
  }
  // Whether the run's records of step s are --shard-optimizer slices (trace format 5).
  bool sharded_at(std::int64_t s) const {
    for (int r : run.trace.ranks) {
      auto it = run.trace.steps.find({r, s});
      if (it != run.trace.steps.end() && it->second.shard) return true;
    }
    return false;
  }
  // The first incident names a rank of this world at step s.
  bool incident_names(std::int64_t s) const;
  // The tensor-parallel degree T that trained step s (1: none): the ranks that recorded it over
  // its data-parallel ranks (trace::StepRow::world), so a run resumed at another T is read as
  // each part ran.
  int tensor_parallel_at(std::int64_t s) const;
  // Where rank r ran at step `step` of the recorded run (the resumed part of a run may have other
  // hosts): for a blamed recorded rank.
  void placement(int r, std::int64_t step, std::string* host, std::string* device) const;
  // The host of each rank of this bisection (its own replay's faults ran there, which after a
  // shrink or in a post-mortem job is not where that rank number ran in training).
  std::vector<std::string> hosts_now;
};

// Where the search stands.
struct Finding {
  std::int64_t step = -1;       // the faulty step
  std::vector<int> bad_shards;  // its differing micro-shards, in order (empty: the update differs)
  int bad_shard = -1;           // the one whose record is wrong
  struct Update {               // the update's first difference from any rank's record
    bool reduced = false;       // the reduced gradient differs
    std::string param;          // the first differing parameter ("" none)
    bool optimizer = false;     // its optimizer state differs, not (yet) its value
    int param_rank = -1;        // whose record holds it
    int replayed_by = -1;       // the lowest rank whose replay differs from a record
    bool from_incident = false;  // only the run's comm incident says this step differs
    // param names the parameter whose slice of the reduced gradient differs (trace format 4), not
    // an updated value; absorbed: the parameters and optimizer state came out as recorded.
    bool from_reduced = false, absorbed = false;
    std::string describe() const;
  } update;
  int blamed = -1;              // the blamed rank
  std::vector<int> candidates;  // no rank could be blamed: one of these is at fault
  std::int64_t sample = -1;     // data: the data set index of the first sample loaded wrongly
  std::string sample_file;      // data: where it is stored (none: synthetic data)
  std::int64_t sample_offset = -1;
  std::optional<Phase> phase;   // --inject's phase
  std::string layer;            // and layer
  ShardResult reference;        // the faulty computation (as recorded, or as the blamed rank computed it)
  ShardResult healthy;          // the computation the healthy devices agree on (kRerun compares with it)
};

// Reads the run, picks the start, opens the rotated engine (bisect.cpp).
Status open_context(Context* ctx);
// Opens the engine for the plan's next part; *none: there is none (bisect.cpp).
Status open_segment(Context* ctx, bool* none);
// The replay engine from the checkpoint `pick` finds before step `before`; *path: its file.
Status open_from(Context* ctx, std::int64_t before, ckpt::Pick pick, std::string* path);
// The run's coverage from ctx.examined, with reasons for the steps not examined (report.cpp);
// `found`: the first faulty step (-1: none).
records::Coverage coverage(const Context& ctx, std::int64_t found);

// kFindStep (find_step.cpp): replays forward, each micro-shard on another rank than recorded it.
Status find_step(Context& ctx, Finding* f, Evidence* ev);
// Whether the trace holds step t whole: a step row and a row of every micro-shard (a --trace-keep
// run has retired older rows; a crash can leave some ranks' rows of a step and not others').
bool recorded(const Context& ctx, std::int64_t t);
// kLocalize (localize.cpp): the differing micro-shard on every rank, or the update's fault.
Status localize(Context& ctx, Finding* f, Evidence* ev);
// kLocalize's update part (localize_update.cpp): the micro-shards reproduce, the update does not.
Status localize_update(Context& ctx, Finding* f, Evidence* ev);
// "0, 1, 3" (localize.cpp).
// Collective: whether every rank finds the data record of the run's data file (docs/data.md).
bool data_record_everywhere(const Context& ctx);
std::string rank_list(const std::vector<int>& ranks);
// kRerun (localize.cpp): the blamed rank recomputes the micro-shard --reruns times.
Status rerun(Context& ctx, Finding* f, Evidence* ev);

// report.cpp: the diagnosis a verdict makes of a finding; RUN/diagnosis.html; the printed summary.
void conclude(const Context& ctx, const Finding& f, Verdict v, records::Diagnosis* d);
Status write_html(const Context& ctx, const records::Diagnosis& d);
void print_summary(const records::Diagnosis& d, const std::string& run_dir);

}  // namespace culprit::bisect
