// See file_io.h.
#include <tapegrad/core/file_io.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include <tapegrad/core/error.h>

namespace tg::detail {

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

std::string errno_str() { return std::strerror(errno); }

File open_for_reading(const std::string& path, const char* op) {
  File f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  TG_CHECK(f.get() >= 0, op, "('", path, "'): cannot open: ", errno_str());
  return File(f.release());
}

uint64_t file_size(int fd, const std::string& path, const char* op) {
  struct stat st {};
  TG_CHECK(::fstat(fd, &st) == 0, op, "('", path, "'): stat failed: ", errno_str());
  TG_CHECK(S_ISREG(st.st_mode), op, "('", path, "'): not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

void write_all(int fd, const void* data, size_t n, const std::string& path, const char* op) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    TG_CHECK(w > 0, op, "('", path, "'): write failed: ", errno_str());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void read_all(int fd, void* data, size_t n, uint64_t offset, const std::string& path, std::string_view what,
              const char* op) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    TG_CHECK(r >= 0, op, "('", path, "'): reading ", what, " failed: ", errno_str());
    TG_CHECK(r > 0, op, "('", path, "'): the file ended while reading ", what);
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

void write_atomically(const std::string& path, const char* op, const std::function<void(int fd)>& write) {
  // One temp file per call (pid and a process-wide counter): two threads saving to one path must
  // not write into the same temp file, which would rename a mix of both into place.
  static std::atomic<uint64_t> count{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(count.fetch_add(1));
  File f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  TG_CHECK(f.get() >= 0, op, "('", path, "'): cannot create ", tmp, ": ", errno_str());
  try {
    write(f.get());
    TG_CHECK(::fsync(f.get()) == 0, op, "('", path, "'): fsync failed: ", errno_str());
    TG_CHECK(::close(f.release()) == 0, op, "('", path, "'): close failed: ", errno_str());
    TG_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, op, "('", path, "'): rename from ", tmp, " failed: ",
             errno_str());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable; failure here leaves a complete file, so only warn.
  const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  File d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.get() >= 0 && ::fsync(d.get()) != 0) log_warning(std::string(op) + ": fsync of directory " + dir + " failed");
}

}  // namespace tg::detail
