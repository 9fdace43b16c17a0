// The message of the tg::Error that f() throws, or a marker string when it throws none: tests
// then assert on the text (EXPECT_NE(error_of(...).find("op"), npos)) with the whole message in
// the failure output.
#pragma once
#include <string>

#include <tapegrad/core/error.h>

namespace tg::testing {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const tg::Error& e) {
    return e.what();
  }
  return "<no tg::Error thrown>";
}

}  // namespace tg::testing
