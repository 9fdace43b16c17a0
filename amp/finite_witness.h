// Finiteness witnesses: a gradient whose elements are all finite exactly when the elements of
// a few smaller tensors are, so that GradScaler's inf/NaN check can read those instead.
//
// The case that matters is a float32 gradient computed by a GEMM (or a sum) from float16
// operands, as matmul / linear backward do under autocast (the weight gradient is stored in
// float32 directly, see Node::wide_grad_dtype). Each product of two float16 values is exact in
// float32 and at most 65504^2 ~ 4.3e9, so a sum of k of them stays below FLT_MAX for any
// realistic k (k < 7.9e28): finite operands give a finite result. And every operand element
// reaches every output of its row or column (dW[i][j] = sum_b X[b][i] * dY[b][j]), where an
// infinity times a finite value or zero is inf or NaN and any sum holding one stays non-finite:
// a non-finite operand gives a non-finite result. So the check of a 64 MB weight gradient of
// Linear(4096, 4096) at batch 256 can read its 2 + 2 MB of operands instead. bfloat16 has
// float32's range (its products can overflow), so only float16 operands qualify.
//
// Witnesses are noted only while an enabled GradScaler lives (it holds a witness_token()): its
// checks consume them every step. The registry holds the operands until the gradient is
// checked, or dies and is purged; an entry is valid
// only while the gradient and every operand keep the versions they had when it was noted (an
// in-place change to any of them falls back to checking the gradient itself).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include <tapegrad/core/tensor.h>

namespace tg::amp::detail {

// Witnesses are noted while at least one token lives.
std::shared_ptr<void> witness_token();

// Notes that `grad` (freshly computed, float32) is finite iff every operand is: call only
// where that holds (see above). Ignored unless the operands are dense, float16 and on grad's
// device, and either at most a quarter of grad's bytes or all held by the latest kept entry
// (the entry keeps them alive until the check). Whether reading them pays is decided at the
// check (GradScaler::check_grads).
void note_finite_witness(const Tensor& grad, std::initializer_list<Tensor> operands);

// Consumes grad's entry. With `use`: the operands that stand in for `grad` in an inf/NaN
// check, empty when there is no valid witness (then check grad itself). Without: empty.
std::vector<Tensor> take_finite_witness(const Tensor& grad, bool use = true);

// Drops entries of gradients that no longer exist (and every entry when all is true).
void purge_finite_witnesses(bool all = false);

// Counters for tests: how many gradient checks a witness replaced since the last reset (the
// checker counts each), and the entries held.
void count_finite_witness_use();
int64_t finite_witness_hits();
int64_t finite_witness_entries();
void reset_finite_witness_hits();

}  // namespace tg::amp::detail
