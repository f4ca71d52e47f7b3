// Vocabularies: an enum whose values have one serialised name each (as Megatron's `str, Enum`), kept
// in one table per enum. An enum joins by declaring, next to it,
//   constexpr NameTable<E> enum_names(E) { return {kTable, std::size(kTable), "what it names"}; }
// which name_of, parse_name and names_list find by argument-dependent lookup.
#pragma once
#include <cstddef>
#include <string>
#include <type_traits>

namespace culprit {

template <class E>
struct NameRow {
  E value;
  const char* name;
};

template <class E>
struct NameTable {
  const NameRow<E>* rows;
  std::size_t size;
  const char* what;  // for messages: "verdict", "trace level", ...
  const NameRow<E>* begin() const { return rows; }
  const NameRow<E>* end() const { return rows + size; }
};

// The serialised name of v ("?" for a value outside the table: a logic error).
template <class E, class = std::enable_if_t<std::is_enum_v<E>>>
const char* name_of(E v) {
  for (const auto& r : enum_names(E{}))
    if (r.value == v) return r.name;
  return "?";
}

// The value named `text`; false when no value has that name.
template <class E, class = std::enable_if_t<std::is_enum_v<E>>>
bool parse_name(const std::string& text, E* out) {
  for (const auto& r : enum_names(E{}))
    if (text == r.name) {
      *out = r.value;
      return true;
    }
  return false;
}

// "a, b, c": every name, in table order (for "valid: ..." in error lines and help).
template <class E, class = std::enable_if_t<std::is_enum_v<E>>>
std::string names_list(const char* sep = ", ") {
  std::string out;
  for (const auto& r : enum_names(E{})) out += (out.empty() ? "" : sep) + std::string(r.name);
  return out;
}

}  // namespace culprit
