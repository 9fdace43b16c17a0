// CUDA reductions: layout planning (coalesce, pick Inner / Middle, or copy the
// reduced dims last) and Sum / Mean / Var / Std. Max / Min / ArgMax: reduce_minmax.cu.
#include <algorithm>
#include <limits>
#include <mutex>
#include <vector>

#include <tapegrad/core/backend/cuda/kernels.cuh>
#include <tapegrad/core/backend/cuda/reduce.cuh>

namespace tg::cuda::kern {

using backend::ElemOp;
using backend::ReduceOp;

int sm_count(int device) {
  static std::once_flag once;
  static std::vector<int> counts;
  std::call_once(once, [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    counts.assign(static_cast<size_t>(std::max(n, 1)), 132);
    for (int d = 0; d < n; ++d)
      if (cudaDeviceGetAttribute(&counts[d], cudaDevAttrMultiProcessorCount, d) != cudaSuccess) {
        (void)cudaGetLastError();  // this query's own error, not a later launch's: the default stays
        counts[d] = 132;
      }
  });
  return device >= 0 && device < static_cast<int>(counts.size()) ? counts[device] : 132;
}

namespace {

struct Dim {
  int64_t size, stride;
};

// Merges neighbours (in the given order) that are contiguous with each other.
std::vector<Dim> coalesce(const std::vector<Dim>& dims) {
  std::vector<Dim> r;
  for (const Dim& d : dims) {
    if (d.size == 1) continue;
    if (!r.empty() && r.back().stride == d.stride * d.size) {
      r.back().size *= d.size;
      r.back().stride = d.stride;
    } else {
      r.push_back(d);
    }
  }
  return r;
}

void fill_out(const Tensor& out, double value) {
  backend::ElementwiseIter it;
  it.ndim = 1;
  it.noperands = 1;
  it.numel = out.numel();
  it.shape[0] = out.numel();
  it.strides[0][0] = 1;
  it.data[0] = static_cast<char*>(out.data_ptr());
  it.dtypes[0] = out.dtype();
  it.contiguous = true;
  it.dparams[0] = value;
  it.iparams[0] = Scalar::saturate_to_int64(value);
  it.device = out.device();
  elementwise(ElemOp::Fill, it);
}

void run_sum_var(ReduceOp op, DType dt, const ReducePlan& plan, int64_t correction) {
  const char* name = backend::reduce_op_name(op);
  if (op == ReduceOp::Sum) {
    dispatch<kFloats | kInts | kBoolSet>(dt, name, [&](auto tag) {
      using S = typename decltype(tag)::type;
      run_reduce<SumReducer<S>, S>(SumReducer<S>{false, plan.K}, plan);
    });
  } else if (op == ReduceOp::Mean) {
    dispatch<kFloats>(dt, name, [&](auto tag) {
      using S = typename decltype(tag)::type;
      run_reduce<SumReducer<S>, S>(SumReducer<S>{true, plan.K}, plan);
    });
  } else {
    dispatch<kFloats>(dt, name, [&](auto tag) {
      using S = typename decltype(tag)::type;
      run_reduce<WelfordReducer<S>, S>(WelfordReducer<S>{plan.K, correction, op == ReduceOp::Std}, plan);
    });
  }
}

}  // namespace

void reduce(const backend::ReduceArgs& args) {
  const Tensor& in = args.in;
  const Tensor& out = args.out;
  const char* name = backend::reduce_op_name(args.op);
  int64_t M = out.numel();
  if (M == 0) return;
  std::vector<bool> reduced(static_cast<size_t>(in.dim()), false);
  for (int64_t d : args.dims) reduced[static_cast<size_t>(d)] = true;
  int64_t K = 1;
  std::vector<Dim> kept, red;
  for (int64_t d = 0; d < in.dim(); ++d) {
    Dim dim{in.sizes()[d], in.strides()[d]};
    if (reduced[static_cast<size_t>(d)]) {
      K *= dim.size;
      red.push_back(dim);
    } else {
      kept.push_back(dim);
    }
  }
  if (K == 0) {
    switch (args.op) {
      case ReduceOp::Sum: fill_out(out, 0.0); return;
      case ReduceOp::Mean:
      case ReduceOp::Var:
      case ReduceOp::Std: fill_out(out, std::numeric_limits<double>::quiet_NaN()); return;
      default: TG_ERROR(name, ": cannot reduce over an empty dimension of a tensor of shape ", in.sizes(),
                        " (the operation has no identity)");
    }
  }

  ReducePlan plan;
  plan.device = in.device().index();
  plan.stream = detail::current_stream_handle(plan.device);
  plan.out = out.data_ptr();
  plan.out_dtype = out.dtype();
  plan.M = M;
  plan.K = K;
  plan.in = static_cast<const char*>(in.data_ptr());
  kept = coalesce(kept);
  red = coalesce(red);
  if (red.empty()) red.push_back({1, 1});
  if (kept.empty()) kept.push_back({1, 0});

  DataPtr tmp;
  bool planned = false;
  if (red.size() == 1 && kept.size() == 1) {
    if (red[0].stride == 1) {
      plan.kind = ReducePlan::kInner;
      plan.row_stride = kept[0].stride;
      planned = true;
    } else if (kept[0].stride == 1) {
      plan.kind = ReducePlan::kMiddle;
      plan.A = 1;
      plan.B = kept[0].size;
      plan.sk = red[0].stride;
      planned = true;
    }
  } else if (red.size() == 1 && kept.size() == 2 && kept[1].stride == 1) {
    plan.kind = ReducePlan::kMiddle;
    plan.A = kept[0].size;
    plan.sa = kept[0].stride;
    plan.B = kept[1].size;
    plan.sk = red[0].stride;
    planned = true;
  }
  if (!planned) {
    // Any other layout: copy to [kept..., reduced...] contiguous (reduced dims keep
    // their order, so ArgMax's flattened index is unchanged), then an Inner reduction.
    TG_CHECK(kept.size() + red.size() <= static_cast<size_t>(backend::kMaxDims), name, ": too many dims ", in.sizes());
    size_t esize = element_size(in.dtype());
    tmp = detail::device_allocate(static_cast<size_t>(M * K) * esize, plan.device);
    backend::ElementwiseIter it;
    it.noperands = 2;
    it.numel = M * K;
    int64_t stride = 1;
    std::vector<Dim> all = kept;
    all.insert(all.end(), red.begin(), red.end());
    it.ndim = static_cast<int>(all.size());
    for (int d = it.ndim - 1; d >= 0; --d) {
      it.shape[d] = all[d].size;
      it.strides[0][d] = stride;
      it.strides[1][d] = all[d].stride;
      stride *= all[d].size;
    }
    it.data[0] = static_cast<char*>(tmp.get());
    it.data[1] = const_cast<char*>(plan.in);
    it.dtypes[0] = it.dtypes[1] = in.dtype();
    it.device = in.device();
    elementwise(ElemOp::Copy, it);
    plan.in = static_cast<const char*>(tmp.get());
    plan.kind = ReducePlan::kInner;
    plan.row_stride = K;
  }

  switch (args.op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
    case ReduceOp::Var:
    case ReduceOp::Std: run_sum_var(args.op, in.dtype(), plan, args.correction); break;
    default: reduce_minmax(args.op, in.dtype(), plan); break;
  }
}

}  // namespace tg::cuda::kern
