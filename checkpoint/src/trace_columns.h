// The trace's columns and header (private to culprit_checkpoint): what the writer (trace.cpp) and
// the reader (trace_read.cpp) share, every column driven by one table (trace_table.h). Every raw
// HDF5 call of the trace is here or behind h5.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "culprit/h5.h"
#include "culprit/trace.h"

namespace culprit::trace::detail {

std::string join(const std::vector<std::string>& v);
std::vector<std::string> split(const std::string& s);

// The columns a file of header `h` has in group R (/steps: StepRow, /shards: ShardRow), as the
// table (trace_table.h) lists them.
template <class R>
Status create_columns(hid_t group, const Header& h);
// Appends rows[0, n) at row `row0`, each with its checksum (the file's rank h.rank, index row0 + i).
template <class R>
Status put_rows(hid_t group, const Header& h, std::int64_t row0, const R* rows, std::int64_t n);
// The `n` committed rows of a group of a file of any readable format (h as read), each checked
// against its checksum (format 3); *torn gets the rows present beyond them.
template <class R>
Status get_rows(hid_t group, const std::string& where, const Header& h, std::int64_t n, std::vector<R>* out,
                std::int64_t* torn);
// Reads rows [0, n) of a column after checking its shape; *extent gets its row count.
Status get(hid_t group, const std::string& where, const char* name, hid_t type, std::size_t elem, std::int64_t width,
           std::int64_t n, std::vector<unsigned char>* out, std::int64_t* extent);
Status write_header(hid_t f, const Header& h);
// Any readable format version (kTraceOldestReadable..kTraceVersion); h->format_version says which.
Status read_header(hid_t f, Header* h);
// Committed rows whose step is <= keep_through_step (rows are in step order).
Status count_through(hid_t group, const std::string& where, std::int64_t committed, std::int64_t keep, std::int64_t* n);

}  // namespace culprit::trace::detail
