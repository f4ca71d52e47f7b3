// The bisection's state machine (docs/bisect.md has the diagram). The driver (bisect.cpp) performs the
// action of the current state (actions.h), agrees the evidence across ranks, and asks next() where
// to go. Pure: no I/O, no MPI.
#pragma once
#include <iterator>

#include "culprit/names.h"
#include "culprit/records.h"

namespace culprit::bisect {

enum class State {
  kFindStep,  // replay forward from a checkpoint, each micro-shard on another rank than recorded it
  kLocalize,  // at the first differing step: every rank recomputes the differing micro-shard
  kRerun,     // the blamed rank recomputes it again and again: persistent or transient
  kDone,
};

inline constexpr NameRow<State> kStateNames[] = {
    {State::kFindStep, "find-step"}, {State::kLocalize, "localize"}, {State::kRerun, "rerun"}, {State::kDone, "done"}};
constexpr NameTable<State> enum_names(State) { return {kStateNames, std::size(kStateNames), "state"}; }

// What the current state's action found, the same on every rank.
struct Evidence {
  // kFindStep
  bool step_found = false;            // a step whose replay disagrees with the trace
  bool nonfinite_reproduced = false;  // none did, and a recorded NaN/Inf or spike reproduced bitwise
  bool unexamined = false;            // none did, but part of the run could not be replayed
  bool data_changed = false;          // none did, and samples of the step in question lie in bytes of
                                      // the data file that changed since prepare-data recorded it
  // kLocalize
  bool replay_fault = false;          // every rank's recomputation agrees with the record: the
                                      // search's own replay computed wrongly (redo the step)
  bool input_differs = false;         // the micro-shard's input as loaded differs from the record
  bool blamed = false;                // one rank explains the difference
  bool healthy_disagree = false;      // replays on healthy ranks disagree among themselves
  bool outside = false;               // the blamed rank is not part of this world: never rerun
  bool at_rest = false;               // the blamed rank's slice changed at rest (--shard-params'
                                      // gather check): a whole replay cannot rerun it
  bool exchange = false;              // the blamed rank's link in a tensor-parallel exchange: a
                                      // replay computes every chunk on one rank, nothing crosses it
  bool rerunnable = false;            // the blamed computation is a micro-shard (else: the update)
  bool update_reproduced = false;     // the update's fault reappeared on its rank in the replay
  bool ambiguous_pair = false;        // two ranks, each reproducing its own result: one of them is
                                      // faulty, and two opinions cannot tell which
  // kRerun
  int reproduced = 0;                 // reruns that reproduced the recorded (faulty) result
};

struct Transition {
  State next = State::kDone;
  Verdict verdict = Verdict::kNone;
};

// The one transition function: from a state and its evidence to the next state (and, on kDone, the
// verdict).
Transition next(State s, const Evidence& e);

}  // namespace culprit::bisect
