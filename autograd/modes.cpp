// Anomaly mode (the NaN / Inf check of every gradient a node returns, and the nodes'
// sequence numbers it names) and the autograd side of inference mode.
#include <cmath>
#include <string>
#include <vector>

#include <tapegrad/autograd/function.h>

namespace tg::autograd {

namespace {
thread_local bool t_anomaly_enabled = false;
thread_local uint64_t t_sequence_nr = 0;
}  // namespace

bool AnomalyMode::is_enabled() { return t_anomaly_enabled; }
void AnomalyMode::set_enabled(bool enabled) { t_anomaly_enabled = enabled; }

uint64_t next_sequence_nr() { return t_sequence_nr++; }

namespace {
void check_anomaly(const Node& node, const std::vector<Tensor>& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined() || !is_floating(g.dtype()) || g.numel() == 0) continue;
    // g * 0 is 0 where g is finite and NaN elsewhere: one scalar read per gradient.
    if (std::isfinite((g * 0).sum().item<double>())) continue;
    const bool has_nan = g.ne(g).to(kFloat64).sum().item<double>() > 0;
    std::string from = "nothing";
    if (i < node.next_edges.size() && node.next_edges[i].valid()) {
      const Node& next = *node.next_edges[i].fn;
      from = std::string("'") + next.name() + "' (sequence number " + std::to_string(next.sequence_nr) + ")";
    }
    TG_ERROR("anomaly detected: the backward of '", node.name(), "' (sequence number ", node.sequence_nr,
             ") returned ", has_nan ? "NaN" : "Inf", " values in its gradient for input ", i, " (shape ", g.sizes(),
             ", dtype ", g.dtype(), ", flowing to ", from, "). The forward op '", node.name(),
             "' produced a value whose gradient is not finite there");
  }
}

}  // namespace

std::vector<Tensor> apply_in_anomaly_mode(Node& node, std::vector<Tensor>&& grads) {
  std::vector<Tensor> outs;
  try {
    outs = node.apply(std::move(grads));
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "\n  (anomaly mode: raised in the backward of '" + node.name() +
                "', sequence number " + std::to_string(node.sequence_nr) + ")");
  }
  check_anomaly(node, outs);
  return outs;
}

void check_not_inference(const Tensor& t, const char* op) {
  TG_CHECK(!t.impl().storage->is_inference(), op, ": an inference tensor (shape ", t.sizes(),
           ", made inside tg::InferenceMode) cannot be saved for backward; clone() it outside InferenceMode to get a "
           "normal tensor");
}

}  // namespace tg::autograd
