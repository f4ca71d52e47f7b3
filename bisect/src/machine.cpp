#include "machine.h"

namespace culprit::bisect {

Transition next(State s, const Evidence& e) {
  switch (s) {
    case State::kFindStep:
      if (e.step_found) return {State::kLocalize, Verdict::kNone};
      // Every step reproduced from the data as it is now, and the data is not what was prepared:
      // the run trained on a damaged file (whatever else could not be examined).
      if (e.data_changed) return {State::kDone, Verdict::kData};
      // Steps that could not be examined come first: a NaN or spike reproduced from a state those
      // steps produced is no proof that the model, not an earlier fault, made it.
      if (e.unexamined) return {State::kDone, Verdict::kInconclusive};
      if (e.nonfinite_reproduced) return {State::kDone, Verdict::kNumericalInstability};
      return {State::kDone, Verdict::kNone};
    case State::kLocalize:
      if (e.replay_fault) return {State::kFindStep, Verdict::kNone};
      if (e.input_differs) return {State::kDone, Verdict::kData};
      if (e.ambiguous_pair) return {State::kDone, Verdict::kHardwarePersistent};
      if (e.healthy_disagree) return {State::kDone, Verdict::kSoftwareNondeterminism};
      if (e.blamed && (e.outside || e.at_rest || e.exchange)) return {State::kDone, Verdict::kHardwareUnconfirmed};
      if (e.blamed && e.rerunnable) return {State::kRerun, Verdict::kNone};
      if (e.blamed) return {State::kDone, e.update_reproduced ? Verdict::kHardwarePersistent : Verdict::kHardwareTransient};
      return {State::kDone, Verdict::kSoftwareNondeterminism};
    case State::kRerun:
      return {State::kDone, e.reproduced > 0 ? Verdict::kHardwarePersistent : Verdict::kHardwareTransient};
    case State::kDone:
      break;
  }
  return {State::kDone, Verdict::kNone};
}

}  // namespace culprit::bisect
