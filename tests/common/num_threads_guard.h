// Test helper: sets the CPU thread pool's size for a scope and restores the old one.
#pragma once
#include <tapegrad/tapegrad.h>

namespace tg_test {

class NumThreadsGuard {
 public:
  explicit NumThreadsGuard(int n) : old_(tg::get_num_threads()) { tg::set_num_threads(n); }
  ~NumThreadsGuard() { tg::set_num_threads(old_); }
  NumThreadsGuard(const NumThreadsGuard&) = delete;
  NumThreadsGuard& operator=(const NumThreadsGuard&) = delete;

 private:
  int old_;
};

}  // namespace tg_test
