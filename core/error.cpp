// tg::Error construction and warning logging.
#include <tapegrad/core/error.h>

#include <cstdio>
#include <cstring>

namespace tg::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  const char* base = std::strrchr(file, '/');
  throw Error(msg + " (" + (base ? base + 1 : file) + ":" + std::to_string(line) + ")");
}

void log_warning(const std::string& msg) { std::fprintf(stderr, "[tapegrad] warning: %s\n", msg.c_str()); }

}  // namespace tg::detail
