// printable(): what culprit prints of names and strings read from possibly damaged files.
#include <gtest/gtest.h>

#include <string>

#include "culprit/status.h"

namespace culprit {
namespace {

TEST(Printable, KeepsAsciiAndValidUtf8) {
  EXPECT_EQ(printable("fc1.weight"), "fc1.weight");
  EXPECT_EQ(printable("h\xc3\xb4te \xe2\x82\xac \xf0\x9f\x92\xa5"), "h\xc3\xb4te \xe2\x82\xac \xf0\x9f\x92\xa5");
}

TEST(Printable, EscapesControlsAndInvalidBytes) {
  EXPECT_EQ(printable(std::string("a\nb\0c", 5)), "a\\x0ab\\x00c");
  EXPECT_EQ(printable("a\nb", /*keep_newlines=*/true), "a\nb");
  EXPECT_EQ(printable("x\x8ay"), "x\\x8ay");          // a lone continuation byte
  EXPECT_EQ(printable("\xc3"), "\\xc3");              // a truncated sequence
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");     // an overlong form
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(printable("\x7f"), "\\x7f");
}

}  // namespace
}  // namespace culprit
