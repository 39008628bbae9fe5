// parallel_for over [0, n) on the hardware threads (host code, used by the CPU reference).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace attnkit::detail {

// Runs fn(i) for every i in [0, n), in chunks pulled from a shared counter so uneven items
// balance. The first exception thrown by any fn is rethrown on the caller's thread.
template <class Fn>
void parallel_for(int64_t n, Fn&& fn, int64_t grain = 1) {
  if (n <= 0) return;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const int64_t workers = std::min<int64_t>(hw, (n + grain - 1) / grain);
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr err;
  std::mutex err_mu;
  auto work = [&] {
    try {
      for (;;) {
        const int64_t b = next.fetch_add(grain);
        if (b >= n) break;
        const int64_t e = std::min(n, b + grain);
        for (int64_t i = b; i < e; ++i) fn(i);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(err_mu);
      if (!err) err = std::current_exception();
      next.store(n);
    }
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (err) std::rethrow_exception(err);
}

}  // namespace attnkit::detail
