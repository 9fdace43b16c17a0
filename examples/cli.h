// The examples' command lines: CLI11 (Debian's libcli11-dev, or its headers in .deps/CLI11/include),
// with the same behaviour in every program:
//   - --help prints the options and exits 0;
//   - a bad option or value prints what was wrong and the usage, and exits 2;
//   - --device cpu|cuda (gpu is an alias of cuda); asking for cuda where no CUDA device is usable
//     is an error (exit 2), never a quiet run on the CPU; without --device a program picks CUDA
//     when it is usable and the CPU otherwise.
//
//   examples::App app{"what the program does", "matmul"};
//   std::string device;
//   examples::add_device_option(app, device);
//   app.add_option("--n", n, "matrix size")->check(CLI::PositiveNumber);
//   if (int rc = examples::parse(app, argc, argv); rc >= 0) return rc;
//   auto dev = examples::pick_device(app, device);
//   if (!dev) return 2;
#pragma once
#include <tapegrad/tapegrad.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace examples {

// A CLI::App whose --help shows each option's default; an option given twice takes the last value.
struct App : CLI::App {
  App(std::string description, std::string name) : CLI::App(std::move(description), std::move(name)) {
    option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
};

// Value checks with plain messages ("--rows: must be a number > 0, got 'abc'"); CLI11's own
// PositiveNumber prints its whole double range for a non-number.
inline CLI::Validator number(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || end != s.c_str() + s.size() || !(allow_zero ? v >= 0 : v > 0))
          return std::string("must be a number ") + (allow_zero ? ">= 0" : "> 0") + ", got '" + s + "'";
        return {};
      },
      allow_zero ? "NUMBER >= 0" : "NUMBER > 0");
}
inline const CLI::Validator kPositive = number(false);
inline const CLI::Validator kNonNegative = number(true);

// --device cpu|cuda|gpu into `device` ("" when not given).
inline CLI::Option* add_device_option(CLI::App& app, std::string& device,
                                      const std::string& help = "cpu or cuda (gpu: cuda); default cuda if usable") {
  return app.add_option("--device", device, help)->check(CLI::IsMember({"cpu", "cuda", "gpu"}));
}

// Parses the command line: -1 to go on, else the exit code (0 after --help, 2 after an error,
// with the message and the usage on stderr).
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s\n\n%s", app.get_name().c_str(), e.what(), app.help().c_str());
    return 2;
  }
  return -1;
}

// A usage error found after parsing (two options that exclude each other, ...): the message and the
// usage on stderr; returns 2, the exit code.
inline int usage_error(const CLI::App& app, const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n\n%s", app.get_name().c_str(), msg.c_str(), app.help().c_str());
  return 2;
}

// The device `name` asks for ("" : CUDA when usable, else the CPU). nullopt, with the reason on
// stderr, when it asks for CUDA and no CUDA device is usable.
inline std::optional<tg::Device> pick_device(const CLI::App& app, const std::string& name) {
  const bool cuda = tg::cuda::is_available();
  if (name.empty()) return cuda ? tg::Device(tg::kCUDA) : tg::Device(tg::kCPU);
  if (name == "cpu") return tg::Device(tg::kCPU);
  if (!cuda) {
#ifdef TG_WITH_CUDA
    const char* why = "the CUDA runtime finds none";
#else
    const char* why = "tapegrad was built without CUDA";
#endif
    std::fprintf(stderr, "%s: --device %s: no usable CUDA device (%s); use --device cpu\n", app.get_name().c_str(),
                 name.c_str(), why);
    return std::nullopt;
  }
  return tg::Device(tg::kCUDA);
}

}  // namespace examples
