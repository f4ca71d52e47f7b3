// A command's options, declared once: one table row per option holds its name, help, how its text
// becomes the value (with the value's checks) and back, and its flags. From the table come the
// parser (the command line, an INI file with --config, the command line winning), the help with
// every default, the INI text of a resolved configuration, the validation of a configuration built in
// code, and the determinism-critical list. Enum-valued options parse into their enum at the edge
// (culprit/names.h); a bad value names the option and the valid values. Built on Boost's
// program_options, which keeps the familiar --name value / --name=value syntax and its messages.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "culprit/names.h"
#include "culprit/status.h"

namespace culprit::opts {

enum Flags : unsigned {
  kNone = 0,
  kCritical = 1,     // fixes a run's results: a resumed run must keep it
  kNotRecorded = 2,  // left out of the INI text (--config, --help, --resume itself)
  kSwitch = 4,       // a boolean: `--name` alone means true (`--name false` too, unless the
                     // command takes arguments without a name: then `--name` alone only)
  kRepeatable = 8,   // may be given many times (each value is set in turn)
  kPositional = 16,  // the arguments without an option name (repeatable; not shown as an option)
  kMultitoken = 32,  // --name A B: takes the tokens up to the next option (repeatable)
  kRequired = 64,    // the command line must give it (an INI file may too); no default shown
};

// One option of a configuration C.
template <class C>
struct Option {
  std::string name;  // --name, and the key in INI files
  std::string help;
  unsigned flags = kNone;
  std::function<Status(C*, const std::string&)> set;      // one value's text into *C (parsed, checked)
  std::function<std::vector<std::string>(const C&)> get;  // the values' texts (one, or one per repetition)
  std::function<Status(const C&)> check;                  // the value's checks, for configurations built in code
};

// Parsing the text of one value (the error names the option).
Status parse_number(const std::string& option, const std::string& text, std::int64_t* out);
Status parse_number(const std::string& option, const std::string& text, std::uint64_t* out);
Status parse_number(const std::string& option, const std::string& text, double* out);
Status parse_bool(const std::string& option, const std::string& text, bool* out);
std::string format_number(double v);  // shortest text that reads back to v

// The allowed values of a number: a closed interval [lo, hi] (lo excluded with lo_open: "(0, 1]"),
// and with or_zero() also 0, which then means something of its own ("0: wait forever"). A
// floating-point value must be finite. The error says the whole range, why hi is what it is when
// that depends on the machine (because()), and the value given, so a value from a --config file or
// a run's recorded configuration is as easy to find as one on the command line.
template <class T>
struct Range {
  T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
  bool lo_open = false;
  bool zero = false;       // 0 is allowed besides [lo, hi]
  std::string zero_means;  // what 0 means, said in the error
  std::string why;         // why hi is what it is ("the system reports 16 cores"), said in the error
  std::string shown;       // the range as the help says it, when hi depends on the machine

  Range() = default;
  Range(T low, T high) : lo(low), hi(high) {}
  static Range at_least(T lo) { return {lo, std::numeric_limits<T>::max()}; }
  static Range above(T lo, T hi) {
    Range r{lo, hi};
    r.lo_open = true;
    return r;
  }
  Range or_zero(std::string means) const {
    Range r = *this;
    r.zero = true;
    r.zero_means = std::move(means);
    return r;
  }
  // hi depends on the machine: the error says `reason`, the help (and so docs/cli.md, the same on
  // every machine) says `in_help` instead of the number ("[1, cores]").
  Range because(std::string reason, std::string in_help) const {
    Range r = *this;
    r.why = std::move(reason);
    r.shown = std::move(in_help);
    return r;
  }
  // What the option's help adds: " (range [1, 10])", "" when every value of T is allowed.
  std::string help_note() const {
    if (!shown.empty()) return " (range " + shown + ")";
    if (!lo_open && !zero && lo == std::numeric_limits<T>::lowest() && hi == std::numeric_limits<T>::max()) return "";
    std::string r = zero ? "0 or " : "";
    if (hi == std::numeric_limits<T>::max() && !lo_open) r += ">= " + text(lo);
    else r += (lo_open ? "(" : "[") + text(lo) + ", " + text(hi) + "]";
    return " (range " + r + ")";
  }
  bool contains(T v) const {
    if constexpr (std::is_floating_point_v<T>)
      if (!std::isfinite(static_cast<double>(v))) return false;
    if (zero && v == T(0)) return true;
    return (lo_open ? v > lo : v >= lo) && v <= hi;
  }
  // What check() says after "must be": "in [1, 16]", "a finite number in (0, 1]", "0 (wait forever)
  // or a finite number in [1, 604800]", "at least 1".
  std::string must_be() const {
    std::ostringstream os;
    if (zero) os << "0 (" << zero_means << ") or ";
    if (std::is_floating_point_v<T>) os << "a finite number ";
    if (hi == std::numeric_limits<T>::max() && !lo_open) os << "at least " << text(lo);
    else os << "in " << (lo_open ? "(" : "[") << text(lo) << ", " << text(hi) << "]";
    return os.str();
  }
  // What an error ends with: ": the system reports 16 cores ..." when hi depends on the machine.
  std::string reason() const { return why.empty() ? "" : ": " + why; }
  Status check(const std::string& option, T v) const {
    if (contains(v)) return Status::OK();
    return Status::BadInput("option '--" + option + "' must be " + must_be() + ", got " + text(v) + reason());
  }

 private:
  static std::string text(T v) {
    if constexpr (std::is_floating_point_v<T>) return format_number(static_cast<double>(v));
    else return std::to_string(v);
  }
};

// ---- row builders ----

// Where an option's value lives in C: a member (&C::steps) or a member of a member
// (field(&C::detect, &DetectorOptions::spot_check)).
template <class C, class T>
struct Field {
  std::function<T*(C*)> at;
  T& operator()(C& c) const { return *at(&c); }
  const T& operator()(const C& c) const { return *at(const_cast<C*>(&c)); }
};
template <class C, class T>
Field<C, T> field(T C::*member) {
  return {[member](C* c) { return &(c->*member); }};
}
template <class C, class S, class T>
Field<C, T> field(S C::*outer, T S::*inner) {
  return {[outer, inner](C* c) { return &((c->*outer).*inner); }};
}

template <class C, class T>
Option<C> number(const char* name, Field<C, T> f, const char* help, Range<T> range = {}, unsigned flags = kNone) {
  static_assert(std::is_arithmetic_v<T>, "number() takes an arithmetic field");
  Option<C> o{name, help + range.help_note(), flags, nullptr, nullptr, nullptr};
  const std::string n = name;
  o.check = [n, f, range](const C& c) { return range.check(n, f(c)); };
  o.set = [n, f, range](C* c, const std::string& text) {
    using Wide = std::conditional_t<std::is_floating_point_v<T>, double,
                                    std::conditional_t<std::is_signed_v<T>, std::int64_t, std::uint64_t>>;
    Wide v{};
    // A text that is no number, or one past every integer, is told the range as well.
    const Status parsed = parse_number(n, text, &v);
    if (!parsed.ok()) return Status::BadInput(parsed.message() + "; it must be " + range.must_be() + range.reason());
    if (v < static_cast<Wide>(std::numeric_limits<T>::lowest()) || v > static_cast<Wide>(std::numeric_limits<T>::max()))
      return Status::BadInput("option '--" + n + "' must be " + range.must_be() + ", got " + text + range.reason());
    f(*c) = static_cast<T>(v);
    return range.check(n, f(*c));
  };
  o.get = [f](const C& c) -> std::vector<std::string> {
    if constexpr (std::is_floating_point_v<T>) return {format_number(f(c))};
    else return {std::to_string(f(c))};
  };
  return o;
}
template <class C, class T>
Option<C> number(const char* name, T C::*member, const char* help, Range<T> range = {}, unsigned flags = kNone) {
  return number<C, T>(name, field(member), help, range, flags);
}

template <class C>
Option<C> flag(const char* name, Field<C, bool> f, const char* help, unsigned flags = kNone) {
  Option<C> o{name, help, flags | kSwitch, nullptr, nullptr, nullptr};
  const std::string n = name;
  o.set = [n, f](C* c, const std::string& text) { return parse_bool(n, text, &f(*c)); };
  o.get = [f](const C& c) -> std::vector<std::string> { return {f(c) ? "true" : "false"}; };
  o.check = [](const C&) { return Status::OK(); };
  return o;
}
template <class C>
Option<C> flag(const char* name, bool C::*member, const char* help, unsigned flags = kNone) {
  return flag<C>(name, field(member), help, flags);
}

template <class C>
Option<C> text(const char* name, Field<C, std::string> f, const char* help, unsigned flags = kNone) {
  Option<C> o{name, help, flags, nullptr, nullptr, nullptr};
  o.set = [f](C* c, const std::string& t) {
    f(*c) = t;
    return Status::OK();
  };
  o.get = [f](const C& c) -> std::vector<std::string> { return {f(c)}; };
  o.check = [](const C&) { return Status::OK(); };
  return o;
}
template <class C>
Option<C> text(const char* name, std::string C::*member, const char* help, unsigned flags = kNone) {
  return text<C>(name, field(member), help, flags);
}

// Every value given, in order (--inject A --inject B; with kPositional: FILE ...; with kMultitoken:
// --compare A B).
template <class C>
Option<C> texts(const char* name, std::vector<std::string> C::*member, const char* help, unsigned flags = kNone) {
  Option<C> o{name, help, flags | kRepeatable, nullptr, nullptr, nullptr};
  o.set = [member](C* c, const std::string& t) {
    (c->*member).push_back(t);
    return Status::OK();
  };
  o.get = [member](const C& c) { return c.*member; };
  o.check = [](const C&) { return Status::OK(); };
  return o;
}

// An enum-valued option: its values are the enum's names (enum_names, culprit/names.h).
template <class C, class E>
Option<C> choice(const char* name, Field<C, E> f, const char* help, unsigned flags = kNone) {
  Option<C> o{name, help, flags, nullptr, nullptr, nullptr};
  const std::string n = name;
  o.set = [n, f](C* c, const std::string& t) {
    if (parse_name(t, &f(*c))) return Status::OK();
    return Status::BadInput("option '--" + n + "': unknown " + enum_names(E{}).what + " '" + t +
                            "' (valid: " + names_list<E>() + ")");
  };
  o.get = [f](const C& c) -> std::vector<std::string> { return {name_of(f(c))}; };
  o.check = [](const C&) { return Status::OK(); };
  return o;
}
template <class C, class E>
Option<C> choice(const char* name, E C::*member, const char* help, unsigned flags = kNone) {
  return choice<C, E>(name, field(member), help, flags);
}

// Any other shape: the caller's parse and format of one value.
template <class C>
Option<C> custom(const char* name, const char* help, std::function<Status(C*, const std::string&)> set,
                 std::function<std::string(const C&)> get, unsigned flags = kNone) {
  Option<C> o{name, help, flags, std::move(set), nullptr, nullptr};
  o.get = [get](const C& c) -> std::vector<std::string> { return {get(c)}; };
  o.check = [](const C&) { return Status::OK(); };
  return o;
}

// ---- the table ----

// What a parse found beyond the values: --help, the options given, the raw values of a --config file.
struct Parsed {
  bool help = false;
  std::vector<std::string> given;  // names given on the command line or in --config, in table order
};

// Type-erased core (options.cpp): Boost.Program_options over rows of text.
struct Row {
  std::string name, help, default_text;
  unsigned flags = kNone;
};
// Parses args (and `--config FILE` when config is true) into name -> values (command line first,
// then the file for options the command line lacks). Unknown options and syntax errors name them.
Status parse_rows(const std::vector<Row>& rows, const std::vector<std::string>& args, bool config,
                  std::vector<std::pair<std::string, std::vector<std::string>>>* values, bool* help);
// The same for INI text (allow_unknown: ignore keys no row has).
Status parse_ini_rows(const std::vector<Row>& rows, const std::string& ini, bool allow_unknown,
                      std::vector<std::pair<std::string, std::vector<std::string>>>* values);
std::string help_text(const std::string& title, const std::vector<Row>& rows, bool config);

template <class C>
class Table {
 public:
  // title: the help's heading ("culprit train options"); config: accept --config FILE.
  Table(std::string title, std::vector<Option<C>> options, bool config = true)
      : title_(std::move(title)), options_(std::move(options)), config_(config) {}

  // The command line (and --config) into *cfg, which starts from C's defaults (or from *base).
  // *parsed (optional) tells --help and which options were given.
  Status parse(const std::vector<std::string>& args, C* cfg, Parsed* parsed = nullptr, const C* base = nullptr) const {
    *cfg = base ? *base : C();
    std::vector<std::pair<std::string, std::vector<std::string>>> values;
    Parsed p;
    CULPRIT_RETURN_IF_ERROR(parse_rows(rows(C()), args, config_, &values, &p.help));
    if (!p.help) CULPRIT_RETURN_IF_ERROR(apply(values, cfg, &p.given));
    for (const auto& o : options_)
      if (!p.help && (o.flags & kRequired) && std::find(p.given.begin(), p.given.end(), o.name) == p.given.end())
        return Status::BadInput("option '--" + o.name + "' is required");
    if (parsed) *parsed = p;
    return Status::OK();
  }
  // INI text (to_ini's, or a file's) into *cfg, on top of what it holds.
  Status parse_ini(const std::string& ini, C* cfg, bool allow_unknown, std::vector<std::string>* given = nullptr) const {
    std::vector<std::pair<std::string, std::vector<std::string>>> values;
    CULPRIT_RETURN_IF_ERROR(parse_ini_rows(rows(C()), ini, allow_unknown, &values));
    std::vector<std::string> g;
    CULPRIT_RETURN_IF_ERROR(apply(values, cfg, &g));
    if (given) *given = g;
    return Status::OK();
  }
  // Every option's checks (a configuration built in code, or loaded from a run).
  Status validate(const C& cfg) const {
    for (const auto& o : options_) CULPRIT_RETURN_IF_ERROR(o.check(cfg));
    return Status::OK();
  }
  // "key = value" per line for every recorded option (repeatable ones once per value); `keep`, when
  // given, leaves out the options it says do not apply to cfg (their defaults are read back).
  std::string to_ini(const C& cfg, const std::function<bool(const std::string&)>& keep = nullptr) const {
    std::string out;
    for (const auto& o : options_) {
      if ((o.flags & kNotRecorded) || (keep && !keep(o.name))) continue;
      for (const auto& v : o.get(cfg)) out += o.name + " = " + v + "\n";
    }
    return out;
  }
  std::string help() const { return help_text(title_, rows(C()), config_); }
  std::vector<std::string> critical() const {
    std::vector<std::string> out;
    for (const auto& o : options_)
      if (o.flags & kCritical) out.push_back(o.name);
    return out;
  }
  const Option<C>* find(const std::string& name) const {
    for (const auto& o : options_)
      if (o.name == name) return &o;
    return nullptr;
  }
  // The value's text as to_ini writes it ("" for an unknown option).
  std::string value_text(const C& cfg, const std::string& name) const {
    const Option<C>* o = find(name);
    if (!o) return "";
    std::string out;
    for (const auto& v : o->get(cfg)) out += (out.empty() ? "" : ",") + v;
    return out;
  }
  const std::vector<Option<C>>& options() const { return options_; }

 private:
  std::vector<Row> rows(const C& defaults) const {
    std::vector<Row> out;
    for (const auto& o : options_) {
      const auto v = o.get(defaults);
      const bool required = o.flags & kRequired;
      out.push_back({o.name, o.help + (required ? " (required)" : ""), v.size() == 1 && !required ? v[0] : std::string(),
                     o.flags});
    }
    return out;
  }
  Status apply(const std::vector<std::pair<std::string, std::vector<std::string>>>& values, C* cfg,
               std::vector<std::string>* given) const {
    // In table order, so an option's checks see the options declared before it.
    for (const auto& o : options_)
      for (const auto& [name, texts] : values) {
        if (name != o.name) continue;
        for (const auto& t : texts) CULPRIT_RETURN_IF_ERROR(o.set(cfg, t));
        given->push_back(name);
      }
    return Status::OK();
  }

  std::string title_;
  std::vector<Option<C>> options_;
  bool config_;
};

}  // namespace culprit::opts
