// ElementwiseKernel's signature parser (core/backend/rtc_host.h; the CUDA build's constructor
// calls it before anything else): three lines of the fuzz bytes are in_params, out_params
// and the kernel name. An accepted signature must satisfy what the code generator relies on.
#include "common.h"
#include <tapegrad/core/backend/rtc_host.h>

namespace rh = tg::cuda::rtc_host;

TG_FUZZ_TARGET {
  const std::string s(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t start = 0;
  for (int k = 0; k < 2; ++k) {
    size_t nl = s.find('\n', start);
    if (nl == std::string::npos) nl = s.size();
    parts.push_back(s.substr(start, nl - start));
    start = nl < s.size() ? nl + 1 : s.size();
  }
  parts.push_back(s.substr(start));
  rh::Signature sig;
  if (!tg_fuzz::accepts([&] { sig = rh::parse_signature(parts[0], parts[1], parts[2]); })) return 0;
  if (sig.ins.empty() || sig.outs.empty() || !rh::is_identifier(parts[2])) abort();
  for (const auto* list : {&sig.ins, &sig.outs})
    for (const auto& p : *list)
      if (!rh::is_identifier(p.name) || p.name == "i" || p.name == "n" || p.type.empty()) abort();
  // The same parse on a C++ ElementwiseKernel (a tg::Error without CUDA, after the parse).
  tg_fuzz::accepts([&] { tg::cuda::ElementwiseKernel(parts[0], parts[1], "y = x", parts[2]); });
  return 0;
}
