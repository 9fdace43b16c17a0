// The library's one way to read and write files: an fd that closes itself, full reads and writes
// that retry on EINTR, and atomic replacement (a temp file of its own, fsync, rename, fsync of the
// directory; the temp file is removed on any failure), so a crash or a full disk never leaves a
// half-written file where a good one was. Used by tg::save (safetensors) and tg::save_npy.
// Internal (tg::detail, not installed). Messages read "<op>('<path>'): ...".
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace tg::detail {

// An fd closed on scope exit (never throws).
class File {
 public:
  explicit File(int fd) : fd_(fd) {}
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();
  int get() const { return fd_; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

std::string errno_str();

// Opens `path` for reading (a tg::Error naming op and path when it cannot).
File open_for_reading(const std::string& path, const char* op);
// The file's size in bytes.
uint64_t file_size(int fd, const std::string& path, const char* op);
void write_all(int fd, const void* data, size_t n, const std::string& path, const char* op);
// n bytes at `offset`; a short file is an error naming `what`.
void read_all(int fd, void* data, size_t n, uint64_t offset, const std::string& path, std::string_view what,
              const char* op);

// Replaces `path` with what `write` writes to the fd it is given, atomically (see above).
void write_atomically(const std::string& path, const char* op, const std::function<void(int fd)>& write);

}  // namespace tg::detail
