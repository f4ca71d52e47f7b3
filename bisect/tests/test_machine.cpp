// The bisection's transition function (bisect/src/machine.cpp): every edge of the diagram in
// docs/bisect.md, and the precedence between conflicting evidence.
#include <gtest/gtest.h>

#include "machine.h"

namespace b = culprit::bisect;
using b::Evidence;
using b::State;
using culprit::Verdict;

namespace {

void expect(State from, const Evidence& e, State to, Verdict v) {
  const auto t = b::next(from, e);
  EXPECT_EQ(t.next, to) << culprit::name_of(from) << " -> " << culprit::name_of(t.next);
  EXPECT_EQ(t.verdict, v) << culprit::name_of(from) << ": " << culprit::name_of(t.verdict);
}

Evidence with(bool Evidence::*flag) {
  Evidence e;
  e.*flag = true;
  return e;
}

}  // namespace

TEST(Machine, FindStep) {
  expect(State::kFindStep, Evidence(), State::kDone, Verdict::kNone);  // everything reproduced
  expect(State::kFindStep, with(&Evidence::step_found), State::kLocalize, Verdict::kNone);
  expect(State::kFindStep, with(&Evidence::nonfinite_reproduced), State::kDone, Verdict::kNumericalInstability);
  // Nothing differs in what was examined, but part of the run could not be: never "none".
  expect(State::kFindStep, with(&Evidence::unexamined), State::kDone, Verdict::kInconclusive);
  // A NaN or spike that reproduced from a state whose past could not be examined: inconclusive.
  Evidence unproven = with(&Evidence::nonfinite_reproduced);
  unproven.unexamined = true;
  expect(State::kFindStep, unproven, State::kDone, Verdict::kInconclusive);
  Evidence both = with(&Evidence::step_found);
  both.nonfinite_reproduced = true;
  expect(State::kFindStep, both, State::kLocalize, Verdict::kNone);  // a differing step comes first
}

TEST(Machine, LocalizeEveryOutcome) {
  expect(State::kLocalize, with(&Evidence::input_differs), State::kDone, Verdict::kData);
  expect(State::kLocalize, with(&Evidence::ambiguous_pair), State::kDone, Verdict::kHardwarePersistent);
  expect(State::kLocalize, with(&Evidence::healthy_disagree), State::kDone, Verdict::kSoftwareNondeterminism);
  Evidence shard = with(&Evidence::blamed);
  shard.rerunnable = true;
  expect(State::kLocalize, shard, State::kRerun, Verdict::kNone);
  expect(State::kLocalize, with(&Evidence::blamed), State::kDone, Verdict::kHardwareTransient);  // the update, gone
  Evidence update = with(&Evidence::blamed);
  update.update_reproduced = true;
  expect(State::kLocalize, update, State::kDone, Verdict::kHardwarePersistent);  // the update's fault came back
  expect(State::kLocalize, Evidence(), State::kDone, Verdict::kSoftwareNondeterminism);  // nobody explains it
  // The record was healthy: the search's own replay was wrong; the search goes on.
  expect(State::kLocalize, with(&Evidence::replay_fault), State::kFindStep, Verdict::kNone);
  // The blamed rank is not in this world: its device cannot be rerun.
  Evidence outside = with(&Evidence::blamed);
  outside.rerunnable = outside.outside = true;
  expect(State::kLocalize, outside, State::kDone, Verdict::kHardwareUnconfirmed);
  outside.rerunnable = false;
  expect(State::kLocalize, outside, State::kDone, Verdict::kHardwareUnconfirmed);
  Evidence at_rest = with(&Evidence::blamed);
  at_rest.at_rest = true;
  expect(State::kLocalize, at_rest, State::kDone, Verdict::kHardwareUnconfirmed);
  at_rest.rerunnable = true;  // even where the micro-shards could be rerun: they were not where it happened
  expect(State::kLocalize, at_rest, State::kDone, Verdict::kHardwareUnconfirmed);
}

TEST(Machine, LocalizePrecedence) {
  // The input as loaded differing is data, whatever else was seen; an ambiguous pair is decided
  // before healthy ranks disagreeing, and both before blaming.
  Evidence e;
  e.replay_fault = e.input_differs = e.ambiguous_pair = e.healthy_disagree = e.blamed = e.rerunnable = true;
  expect(State::kLocalize, e, State::kFindStep, Verdict::kNone);  // a replay fault: no evidence at all
  e.replay_fault = false;
  expect(State::kLocalize, e, State::kDone, Verdict::kData);
  e.input_differs = false;
  expect(State::kLocalize, e, State::kDone, Verdict::kHardwarePersistent);
  e.ambiguous_pair = false;
  expect(State::kLocalize, e, State::kDone, Verdict::kSoftwareNondeterminism);
  e.healthy_disagree = false;
  expect(State::kLocalize, e, State::kRerun, Verdict::kNone);
}

TEST(Machine, Rerun) {
  Evidence e;
  expect(State::kRerun, e, State::kDone, Verdict::kHardwareTransient);
  e.reproduced = 1;
  expect(State::kRerun, e, State::kDone, Verdict::kHardwarePersistent);  // once is enough: intermittent
  e.reproduced = 8;
  expect(State::kRerun, e, State::kDone, Verdict::kHardwarePersistent);
}

TEST(Machine, DoneStaysDoneAndStatesHaveNames) {
  expect(State::kDone, with(&Evidence::step_found), State::kDone, Verdict::kNone);
  EXPECT_STREQ(culprit::name_of(State::kFindStep), "find-step");
  EXPECT_STREQ(culprit::name_of(State::kRerun), "rerun");
}
