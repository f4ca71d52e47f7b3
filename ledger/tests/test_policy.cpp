// The drain policy over ledger rows (culprit/ledger.h, summarize): pure, no file.
#include <gtest/gtest.h>

#include "culprit/ledger.h"

namespace l = culprit::ledger;

namespace {

l::Entry row(const std::string& host, const std::string& verdict, const std::string& run, std::int64_t step,
             const std::string& job = "", const std::string& action = "none") {
  static std::int64_t id = 0;
  l::Entry e;
  e.id = ++id;
  e.time = "2026-12-0" + std::to_string(1 + id % 9) + "T00:00:00Z";
  e.host = host;
  e.verdict = verdict;
  e.run = run;
  e.step = step;
  e.job = job;
  e.action = action;
  return e;
}

const l::HostSummary& of(const std::vector<l::HostSummary>& all, const std::string& host) {
  for (const auto& h : all)
    if (h.host == host) return h;
  throw std::runtime_error("no host " + host);
}

}  // namespace

TEST(Policy, OnePersistentIsProofEnough) {
  const auto s = l::summarize({row("n1", "hardware-persistent", "/r/a", 5)}, l::Policy{});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(s[0].drain);
  EXPECT_EQ(s[0].why, "1 hardware-persistent (--persistent 1)");
}

TEST(Policy, OneTransientIsNotAPatternTwoAre) {
  EXPECT_FALSE(l::summarize({row("n1", "hardware-transient", "/r/a", 5)}, l::Policy{})[0].drain);
  const auto two = l::summarize({row("n1", "hardware-transient", "/r/a", 5, "1"),
                                 row("n1", "hardware-transient", "/r/b", 9, "2")}, l::Policy{});
  EXPECT_TRUE(two[0].drain);
  EXPECT_EQ(two[0].findings.at("hardware-transient"), 2);
  EXPECT_EQ(two[0].runs, 2);
  EXPECT_EQ(two[0].jobs, 2);
}

TEST(Policy, TheSameFaultRecordedTwiceIsOneFinding) {
  // A post-mortem repeating the in-job diagnosis (same run and step, another job): one fault.
  const auto s = l::summarize({row("n1", "hardware-transient", "/r/a", 5, "1"),
                               row("n1", "hardware-transient", "/r/a", 5, "2")}, l::Policy{});
  EXPECT_FALSE(s[0].drain);
  EXPECT_EQ(s[0].rows, 2);
  EXPECT_EQ(s[0].findings.at("hardware-transient"), 1);
  // A job's verdict and a post-mortem's of the same fault: one.
  const auto pm = l::summarize({row("n1", "hardware-transient", "/r/a", 5, "1", "retried"),
                                row("n1", "hardware-transient", "/r/a", 5, "9")}, l::Policy{});
  EXPECT_EQ(pm[0].findings.at("hardware-transient"), 1);
  // The job's script recording twice: one.
  const auto twice = l::summarize({row("n1", "hardware-transient", "/r/a", 5, "1", "retried"),
                                   row("n1", "hardware-transient", "/r/a", 5, "1", "retried")}, l::Policy{});
  EXPECT_EQ(twice[0].findings.at("hardware-transient"), 1);
  // Without a step, the job tells them apart: two silent-rank jobs of one run are two findings.
  const auto silent = l::summarize({row("n1", "silent-rank", "/r/a", -1, "1"), row("n1", "silent-rank", "/r/a", -1, "2"),
                                    row("n1", "silent-rank", "/r/a", -1, "2")}, l::Policy{});
  EXPECT_EQ(silent[0].findings.at("silent-rank"), 2);
  EXPECT_TRUE(silent[0].drain);
}

TEST(Policy, AFaultThatRecursInTheNextJobIsASecondFinding) {
  // A transient retried on the same node fails again at the same step of the same run, in the
  // chain's next job: the pattern the policy is for.
  const auto s = l::summarize({row("n1", "hardware-transient", "/r/a", 5, "1", "retried"),
                               row("n1", "hardware-transient", "/r/a", 5, "2", "excluded")}, l::Policy{});
  EXPECT_EQ(s[0].findings.at("hardware-transient"), 2);
  EXPECT_TRUE(s[0].drain);
}

TEST(Policy, HardwareCountsAsUnconfirmedAndOtherVerdictsNotAtAll) {
  EXPECT_TRUE(l::summarize({row("n1", "hardware", "/r/a", 3)}, l::Policy{})[0].drain);
  l::Policy p;
  p.unconfirmed = 2;
  const auto s = l::summarize({row("n1", "hardware", "/r/a", 3), row("n1", "hardware-unconfirmed", "/r/b", 3)}, p);
  EXPECT_TRUE(s[0].drain);
  EXPECT_EQ(s[0].why, "2 hardware-unconfirmed/hardware (--unconfirmed 2)");
  const auto other = l::summarize({row("n1", "numerical-instability", "/r/a", 3), row("n1", "data", "/r/b", 4)}, p);
  EXPECT_FALSE(other[0].drain);
  EXPECT_EQ(other[0].score, 0);
}

TEST(Policy, ZeroMeansNever) {
  l::Policy p;
  p.persistent = 0;
  EXPECT_FALSE(l::summarize({row("n1", "hardware-persistent", "/r/a", 5)}, p)[0].drain);
}

TEST(Policy, MostSuspiciousFirstAndTheLastAction) {
  const auto s = l::summarize({row("quiet", "hardware-transient", "/r/a", 1, "1", "retried"),
                               row("bad", "hardware-transient", "/r/a", 2, "1", "retried"),
                               row("bad", "hardware-persistent", "/r/b", 7, "2", "excluded"),
                               row("worse", "hardware-persistent", "/r/c", 1, "3", "excluded"),
                               row("worse", "hardware-persistent", "/r/d", 1, "4", "drained")},
                              l::Policy{});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].host, "worse");  // 2 persistent: score 2 over 1 + 0.5
  EXPECT_EQ(s[1].host, "bad");
  EXPECT_EQ(s[2].host, "quiet");
  EXPECT_FALSE(s[2].drain);
  EXPECT_EQ(of(s, "worse").last_action, "drained");
  EXPECT_EQ(of(s, "bad").last_action, "excluded");
}

TEST(Policy, DevicesAreDistinctAndTimesSpanTheRows) {
  auto a = row("n1", "hardware-transient", "/r/a", 1);
  auto b = row("n1", "hardware-transient", "/r/b", 1);
  auto c = row("n1", "hardware-transient", "/r/c", 1);
  a.device = "cuda:1";
  b.device = "cuda:0";
  c.device = "cuda:1";
  a.time = "2026-12-03T00:00:00Z";
  b.time = "2026-12-01T00:00:00Z";
  c.time = "2026-12-02T00:00:00Z";
  const auto s = l::summarize({a, b, c}, l::Policy{});
  EXPECT_EQ(s[0].devices, (std::vector<std::string>{"cuda:0", "cuda:1"}));
  EXPECT_EQ(s[0].first, "2026-12-01T00:00:00Z");
  EXPECT_EQ(s[0].last, "2026-12-03T00:00:00Z");
}
