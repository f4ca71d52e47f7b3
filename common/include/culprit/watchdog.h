// Deadline-bounded collectives (docs/detection.md, "Silent ranks"). Like NCCL's watchdog: a rank
// waiting in a collective polls it against a deadline; when the deadline passes, the waiting ranks
// ask each other who is there over a communicator of their own, name the rank(s) that do not
// answer (dead or stuck), report once, and end the job with kExitSilentRank.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "culprit/mpi_util.h"
#include "culprit/status.h"

namespace culprit {

struct SilentReport {
  std::int64_t step = 0;
  std::vector<int> silent;  // ranks that did not answer (empty: all answered)
  std::vector<std::string> hosts;  // of every rank
  // Ranks that answered from the user's code (Watchdog::InScript): alive, their main thread still in
  // it. Not silent, not proven healthy: the script hangs, or the device it drives does.
  std::vector<int> in_script;
  // Ranks that answered holding (nearly) every file descriptor their limit allows, and the first
  // one's count: a collective MPI-IO open that could not open a file of its own hangs so.
  std::vector<int> out_of_fds;
  std::string fds_detail;
  std::string message;      // one line naming them, their hosts and where the others waited
  Status cause;             // every rank answered and on_stuck() explained the wait (a full disk)
};

// What a rank says about itself: its step and where it is. A rank that answers is alive; how it
// answers says whether it waits (in a collective), works on its own (busy: between two pieces of
// work of its own, or in the user's code for less than the timeout) or hangs in the user's code.
struct WatchdogWhere {
  std::int64_t step = 0;
  std::int64_t round = 0;  // a query's number; an answer echoes its query's (a late one is ignored)
  double script_s = 0;     // in_script: seconds in the current call of the user's code
  char what[54] = {0};
  char in_script = 0;   // answered by InScript's thread: the main thread runs the user's code
  char busy = 0;        // answered between two pieces of work of its own (Watchdog::busy)
  char out_of_fds = 0;  // the rank holds (nearly) every file descriptor its limit allows
  char fds[32] = {0};   // "19 of 21 open, ulimit -n"
};

// --collective-timeout's help in bisect, replay and audit (train's also names its checkpoint writer).
inline constexpr const char* kCollectiveTimeoutHelp =
    "seconds a rank waits in a collective before it names the silent (dead or stopped) rank(s) and ends the job with "
    "exit 13 (0: wait forever)";

class Watchdog {
 public:
  // Collective over comm. timeout_s <= 0: wait forever (plain MPI_Wait).
  Watchdog(const Comm& comm, double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Called on the one reporting rank before the job ends (log the incident there).
  void on_silence(std::function<void(const SilentReport&)> report) { report_ = std::move(report); }
  // Asked when every rank answered but one waited past the deadline (a stuck writer, a rank in the
  // user's code): an error (a full disk, a script that hangs) replaces the report's message and
  // ends the job with its exit code, not kExitSilentRank, which job scripts read as hardware.
  void on_stuck(std::function<Status(const SilentReport&)> explain) { explain_ = std::move(explain); }
  void set_step(std::int64_t step) { step_ = step; }
  // Completes a nonblocking collective; `what` names it in the report.
  void wait(MPI_Request* req, const char* what);
  // Waits until done() holds (a background writer), answering the other ranks meanwhile.
  void wait_until(const std::function<bool()>& done, const char* what);
  double timeout() const { return timeout_; }

  // While one lives on the thread that made the process's watchdog, a thread of the watchdog's
  // answers roll calls for this rank, saying it runs `what`: the main thread runs the user's code
  // (a script's forward, loss or build()), which cannot answer, and a rank whose script hangs must
  // not be named as stopped. Without a watchdog, or on another thread: nothing. Nested with
  // in_script false (culprit's code called back from the script: a layer hook), the rank answers
  // no more until it returns: a device that hangs there is silent, as in culprit's own code.
  // Between two pieces of work a rank does on its own while others wait for it (an audit's
  // interval, a replayed step, a rerun): answers a roll call with "busy in `what`", so the others
  // wait on instead of naming it. Cheap (one probe); nothing without a watchdog or off its thread.
  static void busy(const char* what);

  class InScript {
   public:
    explicit InScript(const char* what, bool in_script = true);
    ~InScript();
    InScript(const InScript&) = delete;
    InScript& operator=(const InScript&) = delete;

   private:
    Watchdog* w_ = nullptr;
    bool was_in_ = false;
    const char* was_what_ = "";
    double was_since_ = 0;
  };

 private:
  void answer_for_the_script();  // the answering thread's loop
  bool poll(double started, const char* what);  // true: the deadline passed or a rank asked
  // The roll call. Returns (false) only when every rank answered and one is still at work of its
  // own: the caller waits on. Otherwise it reports and ends the job.
  bool expire(const char* what);
  // Hears answers and queries until `until` (or, stop_when_all, everyone answered), answering each
  // query with `me`: who answered and what each said.
  void listen(const WatchdogWhere& me, double until, bool stop_when_all, std::vector<int>* answered,
              std::vector<WatchdogWhere>* where);
  void answer_queries(const char* what, bool in_script);  // under mu_: every query waiting, answered
  void answer(const std::int64_t* query, int from, const char* what);

  MPI_Comm side_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  double timeout_ = 0;
  std::int64_t step_ = 0;
  std::vector<std::string> hosts_;
  std::function<void(const SilentReport&)> report_;
  std::function<Status(const SilentReport&)> explain_;
  // InScript's answering thread, started at the first InScript; mu_ guards its use of side_.
  Watchdog* outer_ = nullptr;  // the process's watchdog before this one (nested commands)
  bool threads_ = false;       // MPI_THREAD_MULTIPLE: InScript's thread may call MPI
  std::int64_t round_ = 0;     // this rank's roll calls so far
  int unexplained_ = 0;        // roll calls in this wait with every rank there and no cause
  std::vector<WatchdogWhere> answers_;  // per asker: the answer in flight
  std::thread answerer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool in_script_ = false, stopping_ = false;
  const char* script_what_ = "";
  double script_since_ = 0;  // when the main thread entered the user's code
};

// What a roll call at which every rank answered says of the ranks: one out of file descriptors (an
// I/O failure: MPI-IO's own open failed), one hung in the user's code on the CPU (the script hangs:
// bad input; on a GPU the device may be what it waits for: OK, the report names nobody); else OK.
Status stuck_cause(const SilentReport& rep, bool device_is_cpu);

// A command's communicator with every collective bounded: `comm` itself when it has a watchdog
// already (a diagnosis inside `culprit train`), else `comm` with a watchdog of its own (collective:
// bisect, replay and audit bound theirs as training does, so a stopped rank is named, not waited for).
class Watched {
 public:
  Watched(const Comm& comm, double timeout_s) : comm_(comm) {
    if (comm_.watchdog) return;
    own_ = std::make_unique<Watchdog>(comm, timeout_s);
    own_->on_stuck([](const SilentReport& rep) { return stuck_cause(rep, /*device_is_cpu=*/true); });
    comm_.watchdog = own_.get();
  }
  const Comm& comm() const { return comm_; }

 private:
  std::unique_ptr<Watchdog> own_;
  Comm comm_;
};

// Completes a nonblocking collective on comm: through its watchdog when it has one.
void complete(const Comm& comm, MPI_Request* req, const char* what);

// Starts a nonblocking collective (the call's last argument must be &_culprit_req) and completes it.
#define CULPRIT_COLLECTIVE(comm, what, icall)                 \
  do {                                                        \
    MPI_Request _culprit_req = MPI_REQUEST_NULL;              \
    CULPRIT_MPI_CHECK(icall);                                 \
    ::culprit::complete((comm), &_culprit_req, (what));       \
  } while (0)

}  // namespace culprit
