// The JSON side of the run's records (private to culprit_checkpoint): what every record's reader
// and writer share (records.cpp: incidents and the diagnosis; reports.cpp: audits and the screen).
#pragma once
#include <cstdint>
#include <fstream>
#include <limits>
#include <vector>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "culprit/names.h"
#include "culprit/status.h"

namespace culprit::records::detail {

using json = nlohmann::ordered_json;

// A vocabulary value read from a record: an unknown name is a damaged record.
template <class E>
E named(const json& j, const char* key) {
  E v{};
  const auto text = j.at(key).get<std::string>();
  if (!parse_name(text, &v))
    throw std::runtime_error(std::string("'") + key + "' is '" + text + "', not a " + enum_names(E{}).what + " (" +
                             names_list<E>() + ")");
  return v;
}

// The record's kind and version come first; a reader refuses another kind or a newer version. A
// record without either is one of culprit 0.1's, before records had versions ("version 0"): its
// fields are read where they are, the newer ones defaulted.
json header(const char* kind, int version);
int check_header(const json& j, const char* kind, int version);  // the record's version (0: none)

// An integer field of a record: JSON's number must be an integer that T holds ("step": 1e30 or
// 2^70 is damage, never a wrapped or saturated value).
template <class T>
T integer(const json& v, const char* key) {
  const auto bad = [&] {
    return std::runtime_error(std::string("'") + key + "' is " + v.dump(-1, ' ', false, json::error_handler_t::replace) +
                              ", not an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                              std::to_string(std::numeric_limits<T>::max()) + "]");
  };
  if (!v.is_number_integer()) throw bad();
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) throw bad();
    return static_cast<T>(u);
  }
  const auto i = v.get<std::int64_t>();
  if (i < static_cast<std::int64_t>(std::numeric_limits<T>::min()) || i > static_cast<std::int64_t>(std::numeric_limits<T>::max()))
    throw bad();
  return static_cast<T>(i);
}
template <class T>
T integer_at(const json& j, const char* key) { return integer<T>(j.at(key), key); }
template <class T>
T integer_or(const json& j, const char* key, T fallback) { return j.contains(key) ? integer_at<T>(j, key) : fallback; }
template <class T>
std::vector<T> integers_or(const json& j, const char* key, std::vector<T> fallback) {
  if (!j.contains(key)) return fallback;
  std::vector<T> out;
  for (const auto& e : j.at(key)) out.push_back(integer<T>(e, key));
  return out;
}

// A field that version 0 records may lack.
template <class T>
T field_or(const json& j, const char* key, T fallback) {
  return j.contains(key) ? j.at(key).get<T>() : fallback;
}

// Strings from damaged files may not be UTF-8: replaced, never thrown on.
std::string dump(const json& j, int indent);

// The whole text, synced; atomic: under a temporary name, then renamed, then the directory synced
// (a crash leaves the old record or the new one, never a part).
Status write_file(const std::string& path, const std::string& text, bool atomic);
// The text of a whole record file: one that is not there is bad input; one that cannot be read an
// I/O failure; one that is not a regular file, or larger than a record of `kind` can be, damaged
// (files::read_regular: a fifo never blocks the reader, a huge file never exhausts its memory).
Status read_record_text(const std::string& path, const char* kind, std::string* text);

// Reads and parses a whole JSON record file of `kind`.
template <class T, class FromJson>
Status read_record(const std::string& path, const char* kind, int version, FromJson from, T* out) {
  std::string text;
  CULPRIT_RETURN_IF_ERROR(read_record_text(path, kind, &text));
  try {
    const json j = json::parse(text);
    check_header(j, kind, version);  // version 0 reads like 1: it holds the same fields
    *out = from(j);
  } catch (const std::exception& e) {
    return Status::Damaged("'" + path + "' is not a culprit " + kind + " record: " + e.what());
  }
  return Status::OK();
}

// A field of a record's JSON as text: strings as they are, null as "", arrays comma-joined; an
// unknown field names the valid ones.
Status field(const json& j, const std::string& name, const char* kind, std::string* out);

}  // namespace culprit::records::detail
