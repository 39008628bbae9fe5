// Helpers for the core tests (kv cache, metadata, merge, validation): error-message checks.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnkit/error.h"

namespace attnkit::test {

// Runs fn; succeeds iff it throws attnkit::Error whose what() contains every substring.
template <class Fn>
::testing::AssertionResult throws_error_with(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      if (msg.find(p) == std::string::npos)
        return ::testing::AssertionFailure()
               << "message \"" << msg << "\" lacks \"" << p << "\"";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-attnkit exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace attnkit::test
