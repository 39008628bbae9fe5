// Shared test helpers: seeded random data, and comparisons that report the worst element
// with its coordinates.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/error.h"

namespace attnkit::test {

// The query and key lengths of a batch of requests, as the host arrays a builder or rule reads:
// query_start_loc (qsl) and seq_lens (seq).
struct Batch {
  std::vector<int32_t> qsl{0}, seq;
  void add(int q, int s) {
    qsl.push_back(qsl.back() + q);
    seq.push_back(s);
  }
};

inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::string coords(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  std::ostringstream os;
  os << '[';
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << ']';
  return os.str();
}

// |actual - expected| <= atol + rtol * |expected| everywhere; NaN never passes (except NaN
// expected where nan_ok); -inf/+inf must match exactly. On failure reports how many elements
// failed and the worst one with its coordinates in `shape` (row-major).
template <class A, class E>
::testing::AssertionResult all_close(const std::vector<A>& actual, const std::vector<E>& expected,
                                     const std::vector<int64_t>& shape, double rtol, double atol,
                                     bool nan_ok = false) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << "size " << actual.size() << " != " << expected.size();
  int64_t bad = 0, worst = -1;
  double worst_excess = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]), e = static_cast<double>(expected[i]);
    double excess;
    if (std::isnan(e) && nan_ok) {
      excess = std::isnan(a) ? 0 : INFINITY;
    } else if (std::isnan(a) || std::isnan(e)) {
      excess = INFINITY;
    } else if (std::isinf(e) || std::isinf(a)) {
      excess = (a == e) ? 0 : INFINITY;
    } else {
      excess = std::fabs(a - e) - (atol + rtol * std::fabs(e));
    }
    if (excess > 0) {
      ++bad;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = static_cast<int64_t>(i);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements off (rtol " << rtol << ", atol " << atol
         << "); worst at " << coords(worst, shape) << ": actual "
         << static_cast<double>(actual[worst]) << ", expected "
         << static_cast<double>(expected[worst]);
}

// Runs fn; succeeds iff it throws attnkit::Error whose what() contains every substring. The
// one helper for "this call is refused with a message naming X": use it as
// EXPECT_TRUE(test::throws_error_with([&] { ... }, {"X"})) << "case name"; so that a failure
// points at the call site and says what was thrown (or that nothing was) and the message.
template <class Fn>
::testing::AssertionResult throws_error_with(Fn&& fn, const std::vector<std::string>& parts) {
  auto expected = [&] {
    std::string s = "expected an attnkit::Error containing";
    for (const auto& p : parts) s += " \"" + p + "\"";
    return s;
  };
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
    return ::testing::AssertionFailure()
           << "threw a non-attnkit exception: " << e.what() << "; " << expected();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw something that is not a std::exception; " << expected();
  }
  return ::testing::AssertionFailure() << "did not throw; " << expected();
}

// The model configuration most tests start from: bf16, head size 128, cache in the model's
// dtype, NHD; heads, KV heads, block size and device as given.
inline AttentionConfig model_config(int heads, int kv_heads, int block_size, DeviceSpec device) {
  AttentionConfig c;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_size = 128;
  c.dtype = DType::bf16;
  c.cache_dtype = DType::bf16;
  c.block_size = block_size;
  c.device = device;
  return c;
}

}  // namespace attnkit::test
