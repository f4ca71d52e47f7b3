#include "culprit/status.h"

#include <cstdio>

namespace culprit {

std::string printable(const std::string& text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", b);
    out += buf;
  };
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const auto b = static_cast<unsigned char>(text[i]);
    if ((b >= 0x20 && b < 0x7f) || (keep_newlines && b == '\n')) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    // A multi-byte UTF-8 sequence: lead byte, then 1-3 continuation bytes; no overlong forms,
    // surrogates or code points above U+10FFFF.
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xbf;  // the allowed range of the first continuation byte
    if (b >= 0xc2 && b <= 0xdf) len = 2;
    else if (b == 0xe0) len = 3, lo = 0xa0;
    else if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) len = 3;
    else if (b == 0xed) len = 3, hi = 0x9f;
    else if (b == 0xf0) len = 4, lo = 0x90;
    else if (b >= 0xf1 && b <= 0xf3) len = 4;
    else if (b == 0xf4) len = 4, hi = 0x8f;
    bool ok = len > 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      ok = k == 1 ? c >= lo && c <= hi : c >= 0x80 && c <= 0xbf;
    }
    if (ok) {
      out.append(text, i, len);
      i += len;
    } else {
      escape(b);
      ++i;
    }
  }
  return out;
}

}  // namespace culprit
