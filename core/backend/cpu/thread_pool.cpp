// The CPU thread pool behind tg::parallel_for. Each call becomes a Job whose
// chunks are claimed through an atomic counter by the caller and by the workers
// it wakes, so the caller never idles and several external threads can run
// parallel_for at the same time. The first exception thrown by a chunk is
// rethrown on the caller once every chunk has finished.
#include <tapegrad/core/backend/cpu/thread_pool.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <tapegrad/core/error.h>

namespace tg::cpu {
namespace {

thread_local bool t_in_parallel = false;

// Marks the current thread as inside a parallel region for a scope.
class ParallelRegion {
 public:
  ParallelRegion() : prev_(t_in_parallel) { t_in_parallel = true; }
  ~ParallelRegion() { t_in_parallel = prev_; }
  ParallelRegion(const ParallelRegion&) = delete;
  ParallelRegion& operator=(const ParallelRegion&) = delete;

 private:
  bool prev_;
};

struct Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t begin = 0, end = 0, chunk = 1, nchunks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mutex;
  std::condition_variable finished;
  std::exception_ptr error;  // first failure, guarded by mutex

  // Claims and runs chunks until none are left.
  void work() {
    for (;;) {
      int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= nchunks) return;
      int64_t lo = begin + c * chunk;
      int64_t hi = std::min(end, lo + chunk);
      try {
        (*fn)(lo, hi);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == nchunks) {
        std::lock_guard<std::mutex> lock(mutex);
        finished.notify_all();
      }
    }
  }
};

int default_num_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

class ThreadPool {
 public:
  int num_threads() {
    std::lock_guard<std::mutex> lock(config_mutex_);
    return num_threads_;
  }

  void set_num_threads(int n) {
    TG_CHECK(n >= 1, "set_num_threads: expected a positive number of threads, got ", n);
    TG_CHECK(!t_in_parallel, "set_num_threads: cannot resize the thread pool from inside parallel_for");
    std::lock_guard<std::mutex> lock(config_mutex_);
    if (n == num_threads_) return;
    stop_workers();
    num_threads_ = n;  // workers start lazily with the next parallel call
  }

  void run(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    int64_t range = end - begin;
    int threads = num_threads();
    // Every chunk gets at least `grain` elements.
    int64_t nchunks = std::min<int64_t>(threads, std::max<int64_t>(1, range / grain));
    if (nchunks <= 1) {
      ParallelRegion region;
      fn(begin, end);
      return;
    }
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->begin = begin;
    job->end = end;
    job->chunk = (range + nchunks - 1) / nchunks;
    job->nchunks = (range + job->chunk - 1) / job->chunk;
    {
      std::lock_guard<std::mutex> lock(config_mutex_);
      start_workers();
      std::lock_guard<std::mutex> qlock(queue_mutex_);
      // One queue entry per helper wanted; a helper that finds no chunk left just drops it.
      for (int64_t i = 1; i < job->nchunks && i < static_cast<int64_t>(workers_.size()) + 1; ++i) queue_.push_back(job);
    }
    queue_cv_.notify_all();
    {
      ParallelRegion region;
      job->work();
    }
    std::unique_lock<std::mutex> lock(job->mutex);
    job->finished.wait(lock, [&] { return job->done.load(std::memory_order_acquire) == job->nchunks; });
    if (job->error) std::rethrow_exception(job->error);
  }

 private:
  // Caller holds config_mutex_.
  void start_workers() {
    if (!workers_.empty() || num_threads_ <= 1) return;
    stopping_ = false;
    for (int i = 0; i + 1 < num_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    queue_.clear();
  }
  void worker_loop() {
    t_in_parallel = true;  // nested parallel calls from a chunk run inline
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job->work();
    }
  }

  std::mutex config_mutex_;  // num_threads_ and workers_
  int num_threads_ = default_num_threads();
  std::vector<std::thread> workers_;
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
};

// Never destroyed: workers stay parked at exit instead of being joined while
// other static destructors may still free tensors.
ThreadPool& pool() {
  union Holder {
    ThreadPool pool;
    Holder() : pool() {}
    ~Holder() {}
  };
  static Holder holder;
  return holder.pool;
}

}  // namespace

bool in_parallel_region() { return t_in_parallel; }

}  // namespace tg::cpu

namespace tg {

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  if (grain < 1) grain = 1;
  if (end - begin <= grain || cpu::in_parallel_region()) {
    fn(begin, end);
    return;
  }
  cpu::pool().run(begin, end, grain, fn);
}

int get_num_threads() { return cpu::pool().num_threads(); }

void set_num_threads(int n) { cpu::pool().set_num_threads(n); }

}  // namespace tg
