// The one-process commands over the run directory's files: inspect, verify, diff (checkpoints and
// traces) and report, log (the JSON records, culprit/records.h). Their options, declared once.
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <optional>

#include "culprit/checkpoint_tools.h"
#include "culprit/h5.h"
#include "culprit/records.h"

namespace culprit::ckpt {

namespace fs = std::filesystem;

namespace {

// ---- inspect / verify / diff ----

struct ToolArgs {
  std::vector<std::string> paths;
  bool json = false;
};

opts::Table<ToolArgs> tool_options(bool json) {
  std::vector<opts::Option<ToolArgs>> rows = {
      opts::texts<ToolArgs>("paths", &ToolArgs::paths, "the files", opts::kPositional)};
  if (json) rows.push_back(opts::flag<ToolArgs>("json", &ToolArgs::json, "print JSON"));
  return opts::Table<ToolArgs>("options", rows, /*config=*/false);
}

using Tool = std::function<Status(const ToolArgs&, std::string* out, int* code)>;

cli::Command tool(const std::string& name, const std::string& summary, const std::string& usage, std::size_t paths,
                  bool json, Tool body) {
  auto run = [=](const std::vector<std::string>& args) {
    const auto table = tool_options(json);
    return cli::run_local<ToolArgs>(
        args, table, usage,
        [=](ToolArgs* a) {
          if (a->paths.size() == paths) return Status::OK();
          return Status::BadInput(name + " takes " + std::to_string(paths) + " path" + (paths > 1 ? "s" : "") +
                                  " (see culprit " + name + " --help)");
        },
        [=](const ToolArgs& a, int* code) {
          h5::init();
          std::string out;
          CULPRIT_RETURN_IF_ERROR(body(a, &out, code));
          // Names and strings come from files that may be damaged: what is printed stays valid UTF-8.
          std::fputs(a.json ? out.c_str() : printable(out, true).c_str(), stdout);
          return Status::OK();
        });
  };
  return {name, summary, [=] { return "usage: " + usage + "\n\n" + tool_options(json).help(); }, run};
}

// ---- report ----

enum class Which { kFirst, kLast };
constexpr NameRow<Which> kWhichNames[] = {{Which::kFirst, "first"}, {Which::kLast, "last"}};
constexpr NameTable<Which> enum_names(Which) { return {kWhichNames, std::size(kWhichNames), "choice"}; }

struct ReportArgs {
  std::vector<std::string> paths;
  std::string field;       // RECORD.FIELD
  std::string detector;    // incident: only this detector's
  Which which = Which::kLast;
};

const opts::Table<ReportArgs>& report_options() {
  using R = ReportArgs;
  static const opts::Table<R> table("culprit report options", {
      opts::texts<R>("paths", &R::paths, "a run directory or a record file", opts::kPositional),
      opts::text<R>("field", &R::field,
                    "print one field: diagnosis.F, incident.F, audit.F (of RUN's records) or screen.F (of a "
                    "screen report), F as in docs/records.md; \"\" for an unset field"),
      opts::text<R>("detector", &R::detector, "incident.F: the incidents of this detector only"),
      opts::choice<R>("which", &R::which, "incident.F: first | last of the matching incidents"),
  }, /*config=*/false);
  return table;
}

Status check_report(ReportArgs* a) {
  if (a->paths.size() != 1) return Status::BadInput("report takes one path: a run directory or a record file");
  Detector d{};
  if (!a->detector.empty() && !parse_name(a->detector, &d))
    return Status::BadInput("option '--detector': unknown detector '" + a->detector + "' (valid: " +
                            names_list<Detector>() + ")");
  return Status::OK();
}

// The incident --detector and --which select.
Status pick_incident(const ReportArgs& a, const std::vector<records::Incident>& all, const records::Incident** out) {
  *out = nullptr;
  for (const auto& i : all) {
    if (!a.detector.empty() && name_of(i.detector) != a.detector) continue;
    if (!*out || a.which == Which::kLast) *out = &i;
  }
  if (*out) return Status::OK();
  return Status::BadInput("'" + a.paths[0] + "' holds no incident" + (a.detector.empty() ? "" : " of detector " + a.detector));
}

Status report_field(const ReportArgs& a, std::string* out) {
  const auto dot = a.field.find('.');
  const std::string record = a.field.substr(0, dot), name = dot == std::string::npos ? "" : a.field.substr(dot + 1);
  const std::string& path = a.paths[0];
  std::error_code ec;
  const bool dir = fs::is_directory(path, ec);
  if (record == "screen") {
    records::ScreenReport s;
    CULPRIT_RETURN_IF_ERROR(records::read_screen_report(path, &s));
    return records::field_of(s, name, out);
  }
  if (!dir) return Status::BadInput("--field " + a.field + ": '" + path + "' is not a run directory");
  if (record == "diagnosis") {
    records::Diagnosis d;
    CULPRIT_RETURN_IF_ERROR(records::read_diagnosis(path, &d));
    return records::field_of(d, name, out);
  }
  if (record == "audit") {
    records::AuditReport r;
    CULPRIT_RETURN_IF_ERROR(records::read_audit(records::audit_path(path), &r));
    return records::field_of(r, name, out);
  }
  if (record == "incident") {
    std::vector<records::Incident> all;
    CULPRIT_RETURN_IF_ERROR(records::read_incidents(path, &all));
    const records::Incident* i = nullptr;
    CULPRIT_RETURN_IF_ERROR(pick_incident(a, all, &i));
    return records::field_of(*i, name, out);
  }
  return Status::BadInput("--field '" + a.field + "': the record is diagnosis, incident, audit or screen");
}

// Without --field: what the run's records say, for people.
Status report_summary(const std::string& run_dir, std::string* out) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return Status::BadInput("'" + run_dir + "' is not a run directory");
  std::vector<records::Incident> incidents;
  CULPRIT_RETURN_IF_ERROR(records::read_incidents(run_dir, &incidents));
  *out += "incidents: " + std::to_string(incidents.size()) + "\n";
  for (const auto& i : incidents)
    *out += "  step " + std::to_string(i.step) + " " + name_of(i.detector) + " (" + name_of(i.cls) + ")" +
            (i.rank >= 0 ? " rank " + std::to_string(i.rank) + " " + i.host : "") + ": " + i.message + "\n";
  records::Diagnosis d;
  if (fs::exists(records::diagnosis_path(run_dir), ec)) {
    CULPRIT_RETURN_IF_ERROR(records::read_diagnosis(run_dir, &d));
    *out += std::string("diagnosis: ") + name_of(d.verdict) +
            (d.step >= 0 ? ", step " + std::to_string(d.step) : "") + (d.phase ? std::string(", phase ") + name_of(*d.phase) : "") +
            (d.layer.empty() ? "" : ", layer " + d.layer) +
            (d.rank >= 0 ? ", rank " + std::to_string(d.rank) + " (host " + d.host + ", device " + d.device + ")" : "") +
            "\n";
  } else {
    *out += "diagnosis: none (culprit bisect has not run)\n";
  }
  records::AuditReport a;
  if (fs::exists(records::audit_path(run_dir), ec)) {
    CULPRIT_RETURN_IF_ERROR(records::read_audit(records::audit_path(run_dir), &a));
    *out += "audit: " + std::to_string(a.intervals.size()) + " interval(s), " + std::to_string(a.mismatches()) +
            " do not reproduce" + (a.first_bad() ? "; first: " + records::interval_line(*a.first_bad()) : "") + "\n";
  } else {
    *out += "audit: none (culprit audit has not run)\n";
  }
  return Status::OK();
}

// ---- log ----

struct LogArgs {
  std::vector<std::string> paths;
  std::optional<Decision> decision;
  std::int64_t step = -1;
  int exit_code = 0, restart = 0;
  std::string host, exclude, resume_from, next_job, message;
};

const opts::Table<LogArgs>& log_options() {
  using L = LogArgs;
  static const opts::Table<L> table("culprit log options", {
      opts::texts<L>("paths", &L::paths, "the run directory", opts::kPositional),
      opts::custom<L>("decision", "done | stop | requeue | postmortem: what the job script decided",
                      [](L* l, const std::string& t) {
                        Decision d{};
                        if (!parse_name(t, &d))
                          return Status::BadInput("option '--decision': unknown decision '" + t + "' (valid: " +
                                                  names_list<Decision>() + ")");
                        l->decision = d;
                        return Status::OK();
                      },
                      [](const L& l) { return std::string(l.decision ? name_of(*l.decision) : ""); }, opts::kRequired),
      opts::number<L>("step", &L::step, "the faulty step the decision is about (-1: none)", opts::Range<std::int64_t>{-1, 1'000'000'000}),
      opts::number<L>("exit-code", &L::exit_code, "culprit's exit code the decision is about", opts::Range<int>{0, 255}),
      opts::number<L>("restart", &L::restart, "how many follow-up jobs came before this one", opts::Range<int>{0, 1000}),
      opts::text<L>("host", &L::host, "the host blamed (and excluded)"),
      opts::text<L>("exclude", &L::exclude, "requeue: the follow-up job's exclude list"),
      opts::text<L>("resume-from", &L::resume_from, "requeue: the checkpoint the follow-up resumes from"),
      opts::text<L>("next-job", &L::next_job, "requeue: the follow-up job's id"),
      opts::text<L>("message", &L::message, "for people"),
  }, /*config=*/false);
  return table;
}

Status append_decision(const LogArgs& a) {
  const std::string& run_dir = a.paths[0];
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return Status::BadInput("'" + run_dir + "' is not a run directory");
  // incidents.log holds one record a line, key=value: a newline (or any control character) in a
  // value would forge a line of its own. The message is for people and is cleaned when written.
  for (const auto& [name, value] : {std::pair<const char*, const std::string*>{"host", &a.host}, {"exclude", &a.exclude},
                                    {"resume-from", &a.resume_from}, {"next-job", &a.next_job}})
    for (const unsigned char c : *value)
      if (c < 0x20 || c == 0x7f)
        return Status::BadInput(std::string("option '--") + name + "' holds a control character (" +
                                (c == '\n' ? std::string("a newline") : "byte " + std::to_string(c)) +
                                "): a job's decision is one line of the incident log");
  records::Incident inc;
  inc.step = a.step;
  inc.detector = Detector::kJobs;
  inc.cls = IncidentClass::kJobs;
  inc.host = a.host;
  inc.message = a.message;
  inc.job = records::JobDecision{*a.decision, a.restart, a.exit_code, a.exclude, a.resume_from, a.next_job};
  return records::append_incident(run_dir, inc);
}

}  // namespace

std::vector<cli::Command> commands() {
  std::vector<cli::Command> out;
  out.push_back(tool("inspect", "show a checkpoint or trace file (--json for machines)", "culprit inspect FILE [--json]",
                     1, true, [](const ToolArgs& a, std::string* out, int*) { return inspect(a.paths[0], a.json, out); }));
  out.push_back(tool("verify",
                     "recheck every fingerprint of a checkpoint, or of a run directory's checkpoints and traces",
                     "culprit verify RUN|FILE   (exit 0 clean, 4 damaged, 2 no such run or in use, 6 unreadable)",
                     1, false,
                     [](const ToolArgs& a, std::string* out, int* code) {
                       bool clean = false, unreadable = false;
                       // What verify could not start on keeps its category (no such file, a run in
                       // use: 2; permissions: 6); what it found is damage.
                       Status st = verify(a.paths[0], out, &clean, &unreadable);
                       if (!st.ok() && st.code() != StatusCode::kBadInput && st.code() != StatusCode::kIo)
                         return Status::Damaged(st.message());
                       CULPRIT_RETURN_IF_ERROR(st);
                       // Damage found wins; a file it could not read at all leaves the run unchecked.
                       if (!clean) *code = unreadable ? kExitIo : kExitDamaged;
                       return Status::OK();
                     }));
  out.push_back(tool("diff", "compare two checkpoints tensor by tensor", "culprit diff A B   (exit 0 identical, 5 different)",
                     2, false, [](const ToolArgs& a, std::string* out, int* code) {
                       bool same = false;
                       CULPRIT_RETURN_IF_ERROR(diff(a.paths[0], a.paths[1], out, &same));
                       if (!same) *code = kExitDiffers;
                       return Status::OK();
                     }));
  const std::string report_usage = "culprit report RUN|RECORD [--field RECORD.F [--detector D] [--which first|last]]";
  out.push_back({"report", "what a run's records say (incidents, diagnosis, audit); --field: one value, for scripts",
                 [=] { return "usage: " + report_usage + "\n\n" + report_options().help(); },
                 [=](const std::vector<std::string>& args) {
                   return cli::run_local<ReportArgs>(args, report_options(), report_usage, check_report,
                                                     [](const ReportArgs& a, int*) {
                                                       std::string out;
                                                       CULPRIT_RETURN_IF_ERROR(a.field.empty() ? report_summary(a.paths[0], &out)
                                                                                               : report_field(a, &out));
                                                       std::fputs((printable(out, true) + (a.field.empty() ? "" : "\n")).c_str(), stdout);
                                                       return Status::OK();
                                                     });
                 }});
  const std::string log_usage = "culprit log RUN --decision D [--step S --exit-code C --host H ...]";
  out.push_back({"log", "append a job script's decision to the run's incident records (jobs/*.sbatch)",
                 [=] { return "usage: " + log_usage + "\n\n" + log_options().help(); },
                 [=](const std::vector<std::string>& args) {
                   return cli::run_local<LogArgs>(
                       args, log_options(), log_usage,
                       [](LogArgs* a) {
                         if (a->paths.size() != 1) return Status::BadInput("log takes one run directory");
                         return Status::OK();
                       },
                       [](const LogArgs& a, int*) { return append_decision(a); });
                 }});
  return out;
}

}  // namespace culprit::ckpt
