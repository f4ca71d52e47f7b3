// The trace's columns and header (private to culprit_checkpoint): what the writer (trace.cpp) and
// the reader (trace_read.cpp) share. Every raw HDF5 call of the trace is here or behind h5.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/h5.h"
#include "culprit/trace.h"

namespace culprit::trace::detail {

std::string join(const std::vector<std::string>& v);
std::vector<std::string> split(const std::string& s);
hid_t string_type(int chars);

// A column: an extendible 1-D or 2-D dataset.
struct Column {
  const char* name;
  hid_t type;          // memory and file type
  std::int64_t width;  // 0: 1-D
};
Status create_column(hid_t group, const Column& c);
// Writes rows [row0, row0 + n) of column `name`, growing the dataset to row0 + n.
Status put(hid_t group, const char* name, hid_t type, std::int64_t row0, std::int64_t n, std::int64_t width,
           const void* data);
// Reads rows [0, n) of a column after checking its shape; *extent gets its row count.
Status get(hid_t group, const std::string& where, const char* name, hid_t type, std::size_t elem, std::int64_t width,
           std::int64_t n, std::vector<unsigned char>* out, std::int64_t* extent);
Status write_header(hid_t f, const Header& h);
// Any readable format version (kTraceOldestReadable..kTraceVersion); h->format_version says which.
Status read_header(hid_t f, Header* h);
// Committed rows whose step is <= keep_through_step (rows are in step order).
Status count_through(hid_t group, const std::string& where, std::int64_t committed, std::int64_t keep, std::int64_t* n);

}  // namespace culprit::trace::detail
