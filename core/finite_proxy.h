// Finite proxies: smaller tensors whose elements are all finite exactly when a tensor's are,
// noted on the tensor (TensorImpl::finite_proxy) by the op that made it, so that an inf/NaN check
// (GradScaler's) can read them instead. Internal (tg::detail, not installed).
//
// The case that matters is a float32 gradient computed by a GEMM (or a sum) from float16
// operands, as matmul / linear backward do under autocast. Each product of two float16 values is
// exact in float32 and at most 65504^2 ~ 4.3e9, so a sum of k of them stays below FLT_MAX for
// any realistic k (k < 7.9e28): finite operands give a finite result. And every operand element
// reaches every output of its row or column (dW[i][j] = sum_b X[b][i] * dY[b][j]), where an
// infinity times a finite value or zero is inf or NaN and any sum holding one stays non-finite: a
// non-finite operand gives a non-finite result. So the check of the 64 MB weight gradient of
// Linear(4096, 4096) at batch 256 reads its 2 + 2 MB of operands instead. bfloat16 has float32's
// range (its products can overflow), so only the producer can say when the rule holds.
//
// The proxy keeps its operands alive until it is taken (the check takes it) or the tensor dies;
// it is valid only while the tensor and every operand keep the versions they had when noted.
#pragma once
#include <cstdint>
#include <vector>

#include <tapegrad/core/tensor.h>

namespace tg::detail {

struct FiniteProxy {
  uint32_t version = 0;  // of the tensor it stands for
  std::vector<Tensor> operands;
  std::vector<uint32_t> versions;
};

// Notes on `t` (just computed) that it is all finite exactly when `operands` are. Ignored unless
// the operands are dense, on t's device, and together at most a quarter of t's bytes (the proxy
// must be cheap to hold and to read).
void set_finite_proxy(const Tensor& t, std::vector<Tensor> operands);
// Takes t's proxy off it: its operands when t and they are unchanged since, else empty.
std::vector<Tensor> take_finite_proxy(const Tensor& t);
bool has_finite_proxy(const Tensor& t);

// How many checks a proxy replaced since the last reset (the checker counts each), for tests.
void count_finite_proxy_use();
int64_t finite_proxy_hits();
void reset_finite_proxy_hits();

}  // namespace tg::detail
