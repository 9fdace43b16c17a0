// tg::Error and the checking macros. Every user mistake and every CUDA / cuBLAS
// failure becomes a tg::Error whose message names the op and what it was given,
// followed by the file:line of the check.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tg {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
// For destructors and other places that must not throw.
void log_warning(const std::string& msg);
}  // namespace detail

}  // namespace tg

#define TG_ERROR(...) ::tg::detail::throw_error(__FILE__, __LINE__, ::tg::detail::str_cat(__VA_ARGS__))
#define TG_CHECK(cond, ...)  \
  do {                       \
    if (!(cond)) [[unlikely]] { TG_ERROR(__VA_ARGS__); } \
  } while (0)
