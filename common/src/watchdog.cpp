#include "culprit/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

#include "culprit/exit_codes.h"
#include "culprit/system.h"

namespace culprit {

namespace {

using Where = WatchdogWhere;

constexpr int kTagQuery = 7101;   // "I have waited too long: who is there?"
constexpr int kTagAnswer = 7102;  // "here, waiting in ..."

Where where_of(std::int64_t step, const char* what) {
  Where w;
  w.step = step;
  std::strncpy(w.what, what, sizeof w.what - 1);
  std::string fds;
  if (out_of_file_descriptors(&fds)) {
    w.out_of_fds = 1;
    std::strncpy(w.fds, fds.c_str(), sizeof w.fds - 1);
  }
  return w;
}

// The process's watchdog (InScript and busy() find it there: the user's code and long work of a
// rank's own run far from any Comm). Read only on the thread that made it (t_owner).
std::atomic<Watchdog*> g_current{nullptr};
thread_local bool t_owner = false;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

// "rank 1 (host a)", "ranks 1 (host a), 2 (host b)".
std::string named(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  std::string who;
  for (int r : ranks) who += (who.empty() ? "" : ", ") + std::to_string(r) + " (host " + hosts[r] + ")";
  return std::string(ranks.size() > 1 ? "ranks " : "rank ") + who;
}

// Where the waiting ranks wait, grouped: "ranks 0,2 waited in the reduction of step 5".
std::string waits_of(const std::vector<int>& waiting, const std::vector<Where>& where) {
  std::map<std::pair<std::int64_t, std::string>, std::vector<int>> groups;
  for (int r : waiting) groups[{where[r].step, where[r].what}].push_back(r);
  std::string waits;
  for (const auto& [key, ranks] : groups)
    waits += (waits.empty() ? "" : "; ") + std::string(ranks.size() > 1 ? "ranks " : "rank ") + join_ranks(ranks) +
             " waited in " + key.second + " of step " + std::to_string(key.first);
  return waits;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

}  // namespace

Watchdog::Watchdog(const Comm& comm, double timeout_s) : rank_(comm.rank), size_(comm.size), timeout_(timeout_s) {
  CULPRIT_MPI_CHECK(MPI_Comm_dup(comm.comm, &side_));
  MPI_Comm_set_errhandler(side_, MPI_ERRORS_RETURN);
  constexpr int kLen = 64;
  std::vector<char> mine(kLen, 0), all(static_cast<std::size_t>(kLen) * size_, 0);
  std::strncpy(mine.data(), comm.host.c_str(), kLen - 1);
  CULPRIT_MPI_CHECK(MPI_Allgather(mine.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, comm.comm));
  for (int r = 0; r < size_; ++r) hosts_.emplace_back(all.data() + static_cast<std::size_t>(r) * kLen);
  answers_.resize(static_cast<std::size_t>(size_));
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  threads_ = level == MPI_THREAD_MULTIPLE;  // InScript's thread calls MPI beside the main one
  t_owner = true;
  outer_ = g_current.load();
  g_current = this;
}

Watchdog::~Watchdog() {
  if (answerer_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    answerer_.join();
  }
  if (g_current.load() == this) g_current = outer_;
  if (side_ != MPI_COMM_NULL) MPI_Comm_free(&side_);
}

Watchdog::InScript::InScript(const char* what, bool in_script) {
  if (!t_owner) return;  // another thread (a loader's read-ahead): the main thread answers for itself
  Watchdog* w = g_current.load();
  if (!w || w->timeout_ <= 0 || w->size_ == 1 || !w->threads_) return;
  w_ = w;
  std::lock_guard<std::mutex> lock(w->mu_);
  if (!w->answerer_.joinable()) w->answerer_ = std::thread([w] { w->answer_for_the_script(); });
  was_in_ = w->in_script_;
  was_what_ = w->script_what_;
  was_since_ = w->script_since_;
  w->script_what_ = what;
  w->in_script_ = in_script;
  w->script_since_ = now_s();
  w->cv_.notify_all();
}

Watchdog::InScript::~InScript() {
  if (!w_) return;
  // Under the lock: the answering thread is between two looks at side_ (and, leaving the
  // outermost scope, looks no more: the main thread's own polls take over).
  std::lock_guard<std::mutex> lock(w_->mu_);
  w_->in_script_ = was_in_;
  w_->script_what_ = was_what_;
  w_->script_since_ = was_since_;
  w_->cv_.notify_all();
}

void Watchdog::busy(const char* what) {
  if (!t_owner) return;
  Watchdog* w = g_current.load();
  if (!w || w->timeout_ <= 0 || w->size_ == 1) return;
  std::lock_guard<std::mutex> lock(w->mu_);
  if (w->in_script_) return;  // InScript's thread answers meanwhile
  w->answer_queries(what, /*in_script=*/false);
}

void Watchdog::answer_queries(const char* what, bool in_script) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kTagQuery, side_, &flag, &st) != MPI_SUCCESS || !flag) return;
    Where asked;
    if (MPI_Recv(&asked, sizeof asked, MPI_BYTE, st.MPI_SOURCE, kTagQuery, side_, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    // One buffer per asker: a roll call asks each rank once, seconds apart from the next.
    Where& a = answers_[static_cast<std::size_t>(st.MPI_SOURCE)];
    a = where_of(step_, what);
    a.round = asked.round;
    a.in_script = in_script ? 1 : 0;
    a.busy = in_script ? 0 : 1;
    a.script_s = in_script ? now_s() - script_since_ : 0;
    MPI_Request req;
    if (MPI_Isend(&a, sizeof a, MPI_BYTE, st.MPI_SOURCE, kTagAnswer, side_, &req) == MPI_SUCCESS) MPI_Request_free(&req);
  }
}

void Watchdog::answer_for_the_script() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || in_script_; });
    if (stopping_) return;
    answer_queries(script_what_, /*in_script=*/true);
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    lock.lock();
  }
}

bool Watchdog::poll(double started, const char*) {
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, kTagQuery, side_, &flag, MPI_STATUS_IGNORE);  // a late answer is no call
  return flag || MPI_Wtime() - started > timeout_;
}

void Watchdog::wait(MPI_Request* req, const char* what) {
  if (timeout_ <= 0 || size_ == 1) {
    CULPRIT_MPI_CHECK(MPI_Wait(req, MPI_STATUS_IGNORE));
    return;
  }
  double t0 = MPI_Wtime();
  unexplained_ = 0;
  for (unsigned i = 1;; ++i) {
    int done = 0;
    CULPRIT_MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    // The fast path is MPI_Test alone: a roll call can only come from a rank that has waited for
    // the whole timeout, so there is no need to look for one (or at the clock) at every turn.
    if (i % 64 == 0 && MPI_Wtime() - t0 > 0.05) {
      if (poll(t0, what) && !expire(what)) t0 = MPI_Wtime();  // a rank is busy: wait on
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

void Watchdog::wait_until(const std::function<bool()>& done, const char* what) {
  double t0 = MPI_Wtime();
  unexplained_ = 0;
  while (!done()) {
    if (timeout_ > 0 && size_ > 1 && poll(t0, what) && !expire(what)) t0 = MPI_Wtime();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Watchdog::listen(const Where& me, double until, bool stop_when_all, std::vector<int>* answered,
                      std::vector<Where>* where) {
  while (MPI_Wtime() < until) {
    if (stop_when_all && std::count(answered->begin(), answered->end(), 1) == size_) return;
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, side_, &flag, &st) != MPI_SUCCESS || !flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    Where w;
    if (MPI_Recv(&w, sizeof w, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, side_, MPI_STATUS_IGNORE) != MPI_SUCCESS) continue;
    if (st.MPI_TAG == kTagAnswer && w.round != me.round) continue;  // an answer to an earlier roll call
    (*answered)[st.MPI_SOURCE] = 1;
    (*where)[st.MPI_SOURCE] = w;
    if (st.MPI_TAG == kTagQuery) {
      Where& a = answers_[static_cast<std::size_t>(st.MPI_SOURCE)];
      a = me;
      a.round = w.round;
      MPI_Request req;
      if (MPI_Isend(&a, sizeof a, MPI_BYTE, st.MPI_SOURCE, kTagAnswer, side_, &req) == MPI_SUCCESS)
        MPI_Request_free(&req);
    }
  }
}

bool Watchdog::expire(const char* what) {
  // Ask everyone who is there and answer everyone who asks, for a grace period; a query is an
  // answer too. Whoever stays quiet is silent: dead, or stuck outside MPI.
  const double t0 = MPI_Wtime();
  const double grace = std::clamp(timeout_ / 4, 1.0, 10.0);
  // Static: outlives the sends (a roll call returns only when a rank is busy, and the next one is a
  // whole timeout later, long after these few bytes left).
  static Where me;
  me = where_of(step_, what);
  me.round = ++round_;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Request req;
    if (MPI_Isend(&me, sizeof me, MPI_BYTE, r, kTagQuery, side_, &req) == MPI_SUCCESS) MPI_Request_free(&req);
  }
  std::vector<int> answered(size_, 0);
  std::vector<Where> where(size_);
  answered[rank_] = 1;
  where[rank_] = me;
  listen(me, t0 + grace, /*stop_when_all=*/true, &answered, &where);

  SilentReport rep;
  rep.step = step_;
  rep.hosts = hosts_;
  std::vector<int> alive, waiting, busy;  // waiting: in a collective of culprit's (they can report)
  for (int r = 0; r < size_; ++r) (answered[r] ? alive : rep.silent).push_back(r);
  for (int r : alive) {
    const bool hung = where[r].in_script && where[r].script_s > timeout_;
    (hung ? rep.in_script : where[r].busy || where[r].in_script ? busy : waiting).push_back(r);
  }
  // Every rank there, and one still at work of its own (a longer share of an audit, reruns only the
  // blamed rank does, a script's call that has not yet run past the timeout): wait on.
  if (rep.silent.empty() && rep.in_script.empty() && !busy.empty()) return false;
  for (int r : alive)
    if (where[r].out_of_fds) {
      if (rep.out_of_fds.empty()) rep.fds_detail = where[r].fds;
      rep.out_of_fds.push_back(r);
    }
  const std::string waits = waits_of(waiting, where);
  if (rep.silent.empty() && !rep.in_script.empty()) {
    rep.message = named(rep.in_script, hosts_) + " answered but stayed in " +
                  where[rep.in_script[0]].what + " past the collective timeout of " + seconds(timeout_) +
                  ": its script or the device it drives hangs, and nobody is named; " + waits;
    if (explain_) rep.cause = explain_(rep);
    if (!rep.cause.ok()) rep.message = rep.cause.message() + "; " + waits;
  } else if (rep.silent.empty()) {
    rep.message = "every rank answered, but " + std::string(what) + " did not complete within the collective timeout of " +
                  seconds(timeout_) + " (" + waits + ")";
    if (explain_) rep.cause = explain_(rep);
    // Every rank in a collective and nothing to explain it: the last one may have arrived during
    // the roll call (a rank busy until the deadline), and the collective completes now. Once more
    // the whole timeout; a second such roll call in one wait ends the job.
    if (rep.cause.ok() && ++unexplained_ < 2) return false;
    if (!rep.cause.ok()) rep.message = rep.cause.message() + " (" + rep.message + ")";
  } else {
    rep.message = named(rep.silent, hosts_) + " stopped responding: no answer within the collective timeout of " + seconds(timeout_) +
                  " and a grace of " + seconds(grace) + " (dead or stuck); " + waits;
  }
  const int code = exit_code(rep.cause.ok() ? StatusCode::kSilentRank : rep.cause.code());
  if (!waiting.empty() && waiting.front() == rank_) {
    // With what the code means, before Open MPI's own words on MPI_Abort (which read as a crash).
    // Both at once: output written just before MPI_Abort can be lost on the way to mpirun.
    const std::string note = exit_note(code, "");
    std::fprintf(stderr, "culprit: error: %s\n%s", rep.message.c_str(), note.empty() ? "" : (note + "\n").c_str());
    std::fflush(stderr);
    if (report_) report_(rep);
  } else {
    // The lowest live rank reports and ends the job; should it fail to, this rank does.
    listen(me, MPI_Wtime() + grace, false, &answered, &where);
  }
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

Status stuck_cause(const SilentReport& rep, bool device_is_cpu) {
  if (!rep.out_of_fds.empty())
    return Status::IoError("rank " + std::to_string(rep.out_of_fds[0]) + " ran out of file descriptors, " +
                           rep.fds_detail + ": raise the limit and run again (--resume a training)");
  if (!rep.in_script.empty() && device_is_cpu)
    return Status::BadInput("rank " + std::to_string(rep.in_script[0]) + " (host " + rep.hosts[rep.in_script[0]] +
                            ") stayed in the script's code past the collective timeout, answering: the script hangs, "
                            "not the node; fix it, or raise --collective-timeout if it is only slow");
  return Status::OK();
}

void complete(const Comm& comm, MPI_Request* req, const char* what) {
  if (comm.watchdog) {
    comm.watchdog->wait(req, what);
  } else {
    CULPRIT_MPI_CHECK(MPI_Wait(req, MPI_STATUS_IGNORE));
  }
}

}  // namespace culprit
