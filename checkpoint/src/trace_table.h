// The trace's column table (private to culprit_checkpoint): every column of /steps and /shards,
// once. Creating a file, appending rows, reading them and their checksum (trace_columns.cpp) all
// walk these tables, so the writer and the reader cannot disagree (as LevelDB's db/log_format.h
// serves its log's writer and reader). A new column is one line here and its row struct's field;
// the format it arrives in bumps kTraceVersion. Format: docs/checkpoint-format.md.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "culprit/checkpoint_format.h"
#include "culprit/trace.h"

namespace culprit::trace::detail {

// A column's element in the file (native order in memory; strings NUL-padded to a fixed size).
enum class Elem { kInt32, kInt64, kUint64, kFloat, kDouble, kHost, kDevice };
constexpr std::size_t elem_size(Elem e) {
  switch (e) {
    case Elem::kInt32:
    case Elem::kFloat: return 4;
    case Elem::kHost: return format::kHostChars;
    case Elem::kDevice: return format::kDeviceChars;
    default: return 8;
  }
}

// A row's elements: one (a 1-D column), or as many as the header names (a 2-D column, at least one
// wide: HDF5 has no zero-width chunk) or the four words of a SliceRecord.
enum class Width { kOne, kParams, kLayers, kSamples, kSlice };

// The bytes a row checksum covers (fingerprint_bytes over them).
struct RowBytes {
  std::vector<unsigned char> b;
  void add(const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    b.insert(b.end(), c, c + n);
  }
};

// How a column moves between a row's field and the row's stored bytes.
template <class R>
struct Codec {
  // Row bytes, zeroed beforehand, `width` elements of `elem` bytes: a short vector is padded with
  // zeros, a long one cut (as it will read back).
  void (*save)(const R& r, std::int64_t width, std::size_t elem, unsigned char* out);
  // The field from them; `len` the elements it holds (the header's count: the stored width is >= 1).
  void (*load)(R* r, std::int64_t len, std::size_t elem, const unsigned char* in);
  // Its bytes in the row checksum: a vector's every element, a string's `elem` NUL-padded bytes, a
  // slice only when there is one. A field a file lacks is empty then and adds nothing, which is how
  // a format-3 row's checksum stays what its writer computed.
  void (*hash)(const R& r, std::size_t elem, RowBytes* b);
  std::size_t elem;  // the field's element size in memory (0: a string, any length)
  // The widths it fits: kOne, kParams/kLayers/kSamples, kSlice; kNone (what `{}` gives) for the
  // checksum column. well_formed() tests this, not `save == nullptr`: under -fsanitize=undefined
  // GCC will not fold a function pointer's comparison with null in a constant expression.
  enum Kind { kNone, kOne, kVector, kSlice } kind;
};

// The codec of the field `M` (a pointer to member), by the field's type.
template <class M>
struct MemberOf;
template <class R_, class F_>
struct MemberOf<F_ R_::*> {
  using R = R_;
  using F = F_;
};

template <auto M>
struct Field {
  using R = typename MemberOf<decltype(M)>::R;
  using F = typename MemberOf<decltype(M)>::F;
  static constexpr bool kScalar = std::is_arithmetic_v<F>;
  static constexpr bool kVector = std::is_same_v<F, std::vector<Fingerprint>>;
  static constexpr bool kString = std::is_same_v<F, std::string>;
  static_assert(kScalar || kVector || kString || std::is_same_v<F, std::optional<SliceRecord>>,
                "a trace field is a number, a fingerprint vector, a string or a slice");

  static void save(const R& r, std::int64_t width, std::size_t elem, unsigned char* out) {
    const F& v = r.*M;
    if constexpr (kScalar) {
      std::memcpy(out, &v, sizeof v);
    } else if constexpr (kVector) {
      std::memcpy(out, v.data(), sizeof(Fingerprint) * std::min<std::size_t>(v.size(), width));
    } else if constexpr (kString) {
      std::memcpy(out, v.c_str(), strnlen(v.c_str(), elem));  // as strncpy: up to a NUL
    } else if (v) {  // no slice: zeros, read back as none
      const auto w = v->words();
      std::memcpy(out, w.data(), sizeof w);
    }
  }
  static void load(R* r, std::int64_t len, std::size_t elem, const unsigned char* in) {
    F& v = r->*M;
    if constexpr (kScalar) {
      std::memcpy(&v, in, sizeof v);
    } else if constexpr (kVector) {
      v.resize(len);
      std::memcpy(v.data(), in, sizeof(Fingerprint) * v.size());
    } else if constexpr (kString) {
      const char* c = reinterpret_cast<const char*>(in);
      v.assign(c, strnlen(c, elem));
    } else {
      std::uint64_t w[format::kShardColumns];
      std::memcpy(w, in, sizeof w);
      if (std::any_of(w, w + format::kShardColumns, [](std::uint64_t x) { return x != 0; })) v = SliceRecord::of(w);
    }
  }
  static void hash(const R& r, std::size_t elem, RowBytes* b) {
    const F& v = r.*M;
    if constexpr (kScalar) {
      b->add(&v, sizeof v);
    } else if constexpr (kVector) {
      b->add(v.data(), sizeof(Fingerprint) * v.size());
    } else if constexpr (kString) {
      std::vector<unsigned char> f(elem, 0);
      std::memcpy(f.data(), v.data(), std::min(v.size(), elem));
      b->add(f.data(), f.size());
    } else if (v) {
      const auto w = v->words();
      b->add(w.data(), sizeof w);
    }
  }
  static constexpr std::size_t kElem = kScalar ? sizeof(F) : kString ? 0 : sizeof(Fingerprint);
  static constexpr auto kKind = kVector ? Codec<R>::kVector : kScalar || kString ? Codec<R>::kOne : Codec<R>::kSlice;
  static constexpr Codec<R> kCodec{&save, &load, &hash, kElem, kKind};
};
template <auto M>
inline constexpr auto field = Field<M>::kCodec;

inline constexpr int kRowCheck = -1;  // ColumnSpec::check of the checksum column itself

template <class R>
struct ColumnSpec {
  const char* name;
  Elem elem;
  Width width;
  int since;         // the format that added it (kTraceOldestReadable: every file read has it)
  bool layer_only;   // at trace level "layer" only
  int check;         // its place in the row checksum (kRowCheck: the checksum)
  Codec<R> codec;    // none for the checksum, which is no field
};

// In file order: the order columns are created and appended, which fixes the file's layout. A
// checksum hashes the fields in `check` order, a format fact like the rest: /shards hashes
// sample_fp (format 3) after the layer columns.
// clang-format off
inline constexpr ColumnSpec<StepRow> kStepsTable[] = {
  // name        element        width           since  layer  check      field
  {"step",       Elem::kInt64,  Width::kOne,    2,     false, 0,         field<&StepRow::step>},
  {"loss",       Elem::kFloat,  Width::kOne,    2,     false, 1,         field<&StepRow::loss>},
  {"lr",         Elem::kDouble, Width::kOne,    2,     false, 2,         field<&StepRow::lr>},
  {"grad_fp",    Elem::kUint64, Width::kOne,    2,     false, 3,         field<&StepRow::grad_fp>},
  {"param_fp",   Elem::kUint64, Width::kParams, 2,     false, 4,         field<&StepRow::param_fps>},
  {"world",      Elem::kInt32,  Width::kOne,    3,     false, 5,         field<&StepRow::world>},
  {"chunk_fp",   Elem::kUint64, Width::kOne,    3,     false, 6,         field<&StepRow::chunk_fp>},
  {"opt_fp",     Elem::kUint64, Width::kParams, 3,     false, 7,         field<&StepRow::opt_fps>},
  {"reduced_fp", Elem::kUint64, Width::kParams, 4,     false, 8,         field<&StepRow::reduced_fps>},
  {"shard",      Elem::kUint64, Width::kSlice,  5,     false, 9,         field<&StepRow::shard>},
  {"lrs_fp",     Elem::kUint64, Width::kOne,    6,     false, 10,        field<&StepRow::lrs_fp>},
  {"row_check",  Elem::kUint64, Width::kOne,    3,     false, kRowCheck, {}},
};
inline constexpr ColumnSpec<ShardRow> kShardsTable[] = {
  // name           element        width            since  layer  check      field
  {"step",          Elem::kInt64,  Width::kOne,     2,     false, 0,         field<&ShardRow::step>},
  {"shard",         Elem::kInt32,  Width::kOne,     2,     false, 1,         field<&ShardRow::shard>},
  {"rank",          Elem::kInt32,  Width::kOne,     2,     false, 2,         field<&ShardRow::rank>},
  {"host",          Elem::kHost,   Width::kOne,     2,     false, 3,         field<&ShardRow::host>},
  {"device",        Elem::kDevice, Width::kOne,     2,     false, 4,         field<&ShardRow::device>},
  {"loss",          Elem::kFloat,  Width::kOne,     2,     false, 5,         field<&ShardRow::loss>},
  {"grad_fp",       Elem::kUint64, Width::kOne,     2,     false, 6,         field<&ShardRow::grad_fp>},
  {"input_fp",      Elem::kUint64, Width::kOne,     2,     false, 7,         field<&ShardRow::input_fp>},
  {"sample_fp",     Elem::kUint64, Width::kSamples, 3,     false, 11,        field<&ShardRow::sample_fps>},
  {"row_check",     Elem::kUint64, Width::kOne,     3,     false, kRowCheck, {}},
  {"param_grad_fp", Elem::kUint64, Width::kParams,  2,     true,  8,         field<&ShardRow::param_grad>},
  {"fwd_fp",        Elem::kUint64, Width::kLayers,  2,     true,  9,         field<&ShardRow::fwd>},
  {"bwd_fp",        Elem::kUint64, Width::kLayers,  2,     true,  10,        field<&ShardRow::bwd>},
};
// clang-format on

template <class R>
struct TableOf;
template <>
struct TableOf<StepRow> {
  static constexpr const auto& columns = kStepsTable;
};
template <>
struct TableOf<ShardRow> {
  static constexpr const auto& columns = kShardsTable;
};

// What the code walking a table assumes, checked when it compiles: "step" first (the torn tail and
// truncation count on it), one checksum column, the other columns' checksum places 0..N-2 once
// each, every field fitting its column's width and its element the size of the column's (the
// codecs memcpy them).
template <class R, std::size_t N>
constexpr bool well_formed(const ColumnSpec<R> (&t)[N]) {
  const char* step = "step";
  for (std::size_t k = 0; step[k] || t[0].name[k]; ++k)
    if (step[k] != t[0].name[k]) return false;
  int checksums = 0;
  for (std::size_t i = 0; i < N; ++i) {
    const auto& c = t[i];
    if (c.check == kRowCheck) {
      const bool plain = c.elem == Elem::kUint64 && c.width == Width::kOne;
      checksums += (plain && c.codec.kind == Codec<R>::kNone) ? 1 : 2;
      continue;
    }
    if (c.check < 0 || c.check >= static_cast<int>(N) - 1) return false;
    for (std::size_t j = 0; j < i; ++j)
      if (t[j].check == c.check) return false;
    const auto fits = c.width == Width::kOne     ? Codec<R>::kOne
                      : c.width == Width::kSlice ? Codec<R>::kSlice
                                                 : Codec<R>::kVector;
    if (c.codec.kind != fits) return false;
    const bool string = c.elem == Elem::kHost || c.elem == Elem::kDevice;
    if (string ? c.codec.elem != 0 : c.codec.elem != elem_size(c.elem)) return false;
  }
  return checksums == 1;
}
static_assert(well_formed(kStepsTable), "/steps column table");
static_assert(well_formed(kShardsTable), "/shards column table");

}  // namespace culprit::trace::detail
