// The op harness: every elementwise op, reduction, matmul, view, in-place op,
// conversion and factory checked against the float64 reference in
// tests/core/reference.h, on every device present, in every dtype the op
// supports, on contiguous, transposed, strided, broadcast, empty, size-1 and 0-d inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <tapegrad/tapegrad.h>

#include "tests/core/reference.h"

namespace {

using namespace tg::testing;
using tg::Device;
using tg::DType;
using tg::Tensor;

struct DevDType {
  tg::DeviceType dev;
  DType dtype;
};

std::string param_name(const ::testing::TestParamInfo<DevDType>& info) {
  return std::string(info.param.dev == tg::kCPU ? "cpu_" : "cuda_") + tg::dtype_name(info.param.dtype);
}

class OpsTest : public ::testing::TestWithParam<DevDType> {
 protected:
  void SetUp() override {
    if (dev().is_cuda() && !tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
  Device dev() const { return Device(GetParam().dev); }
  DType dtype() const { return GetParam().dtype; }
};
class FloatOps : public OpsTest {};
class IntOps : public OpsTest {};

// Runs one sub-case; an exception fails it without stopping the others.
void run_case(const std::string& what, const std::function<void()>& fn) {
  SCOPED_TRACE(what);
  try {
    fn();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw " << e.what();
  }
}

// Value of `v` after conversion to `t`, as a C++ cast (PyTorch's rules): floats to
// ints truncate, anything to bool is != 0.
double converted(double v, DType t) {
  switch (t) {
    case tg::kBool:
      return v != 0;
    case tg::kInt32:
    case tg::kInt64:
      return std::trunc(v);
    case tg::kFloat16:
      return static_cast<float>(tg::Half(static_cast<float>(v)));
    case tg::kBFloat16:
      return static_cast<float>(tg::BFloat16(static_cast<float>(v)));
    case tg::kFloat32:
      return static_cast<float>(v);
    default:
      return v;
  }
}

// ---------------------------------------------------------------- elementwise

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  Domain dom;
  bool bool_out = false;
};

double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

std::vector<UnaryCase> float_unary_cases() {
  Domain any{-2, 2}, pos{0.1, 5}, nz{-2, 2, true}, grid{-2, 2, false, 4};
  return {
      {"neg", [](const Tensor& x) { return x.neg(); }, [](double x) { return -x; }, any},
      {"operator-", [](const Tensor& x) { return -x; }, [](double x) { return -x; }, any},
      {"exp", [](const Tensor& x) { return x.exp(); }, [](double x) { return std::exp(x); }, {-4, 4}},
      {"tg::exp", [](const Tensor& x) { return tg::exp(x); }, [](double x) { return std::exp(x); }, {-4, 4}},
      {"log", [](const Tensor& x) { return x.log(); }, [](double x) { return std::log(x); }, pos},
      {"sqrt", [](const Tensor& x) { return x.sqrt(); }, [](double x) { return std::sqrt(x); }, {0, 5}},
      {"abs", [](const Tensor& x) { return x.abs(); }, [](double x) { return std::abs(x); }, any},
      {"relu", [](const Tensor& x) { return x.relu(); }, [](double x) { return x > 0 ? x : 0; }, any},
      {"sigmoid",
       [](const Tensor& x) { return x.sigmoid(); },
       [](double x) { return 1 / (1 + std::exp(-x)); },
       {-6, 6}},
      {"tanh", [](const Tensor& x) { return x.tanh(); }, [](double x) { return std::tanh(x); }, {-3, 3}},
      {"gelu", [](const Tensor& x) { return x.gelu(); }, gelu_ref, {-4, 4}},
      {"pow(2)", [](const Tensor& x) { return x.pow(2); }, [](double x) { return x * x; }, any},
      {"pow(3.0)", [](const Tensor& x) { return x.pow(3.0); }, [](double x) { return x * x * x; }, any},
      {"pow(0.5)", [](const Tensor& x) { return x.pow(0.5); }, [](double x) { return std::sqrt(x); }, pos},
      {"pow(-1)", [](const Tensor& x) { return x.pow(-1); }, [](double x) { return 1 / x; }, nz},
      {"pow(1.7)", [](const Tensor& x) { return tg::pow(x, 1.7); }, [](double x) { return std::pow(x, 1.7); }, pos},
      {"clamp(-0.5,1)", [](const Tensor& x) { return x.clamp(-0.5, 1.0); },
       [](double x) { return std::min(std::max(x, -0.5), 1.0); }, any},
      {"x+2.5", [](const Tensor& x) { return x + 2.5; }, [](double x) { return x + 2.5; }, any},
      {"2.5+x", [](const Tensor& x) { return 2.5 + x; }, [](double x) { return 2.5 + x; }, any},
      {"x-1.5", [](const Tensor& x) { return x - 1.5; }, [](double x) { return x - 1.5; }, any},
      {"1.5-x", [](const Tensor& x) { return 1.5 - x; }, [](double x) { return 1.5 - x; }, any},
      {"x*-2", [](const Tensor& x) { return x * -2.0; }, [](double x) { return x * -2; }, any},
      {"3*x", [](const Tensor& x) { return 3 * x; }, [](double x) { return 3 * x; }, any},
      {"x/4", [](const Tensor& x) { return x / 4.0; }, [](double x) { return x / 4; }, any},
      {"2/x", [](const Tensor& x) { return 2.0 / x; }, [](double x) { return 2 / x; }, nz},
      {"x+1 (int scalar)", [](const Tensor& x) { return x + 1; }, [](double x) { return x + 1; }, any},
      {"x==0.5", [](const Tensor& x) { return x == 0.5; }, [](double x) { return double(x == 0.5); }, grid, true},
      {"x!=0.5", [](const Tensor& x) { return x != 0.5; }, [](double x) { return double(x != 0.5); }, grid, true},
      {"x<0.5", [](const Tensor& x) { return x < 0.5; }, [](double x) { return double(x < 0.5); }, grid, true},
      {"x<=0.5", [](const Tensor& x) { return x <= 0.5; }, [](double x) { return double(x <= 0.5); }, grid, true},
      {"x>0.5", [](const Tensor& x) { return x > 0.5; }, [](double x) { return double(x > 0.5); }, grid, true},
      {"x>=0.5", [](const Tensor& x) { return x >= 0.5; }, [](double x) { return double(x >= 0.5); }, grid, true},
  };
}

std::vector<UnaryCase> int_unary_cases() {
  Domain d{-20, 20};
  return {
      {"neg", [](const Tensor& x) { return x.neg(); }, [](double x) { return -x; }, d},
      {"abs", [](const Tensor& x) { return x.abs(); }, [](double x) { return std::abs(x); }, d},
      {"relu", [](const Tensor& x) { return x.relu(); }, [](double x) { return x > 0 ? x : 0; }, d},
      {"clamp(-3,5)", [](const Tensor& x) { return x.clamp(-3, 5); },
       [](double x) { return std::min(std::max(x, -3.0), 5.0); }, d},
      {"x+2", [](const Tensor& x) { return x + 2; }, [](double x) { return x + 2; }, d},
      {"2+x", [](const Tensor& x) { return 2 + x; }, [](double x) { return 2 + x; }, d},
      {"x-3", [](const Tensor& x) { return x - 3; }, [](double x) { return x - 3; }, d},
      {"3-x", [](const Tensor& x) { return 3 - x; }, [](double x) { return 3 - x; }, d},
      {"x*-2", [](const Tensor& x) { return x * -2; }, [](double x) { return -2 * x; }, d},
      {"pow(2)", [](const Tensor& x) { return x.pow(2); }, [](double x) { return x * x; }, d},
      {"x==4", [](const Tensor& x) { return x == 4; }, [](double x) { return double(x == 4); }, d, true},
      {"x<4", [](const Tensor& x) { return x < 4; }, [](double x) { return double(x < 4); }, d, true},
      {"x>=4", [](const Tensor& x) { return x >= 4; }, [](double x) { return double(x >= 4); }, d, true},
  };
}

struct UnaryInput {
  Dims shape;
  Layout layout;
};
std::vector<UnaryInput> unary_inputs() {
  return {{{3, 5}, Layout::kContiguous}, {{3, 5}, Layout::kTransposed},    {{3, 5}, Layout::kStep2},
          {{3, 5}, Layout::kExpanded},   {{2, 3, 4}, Layout::kTransposed}, {{0, 5}, Layout::kContiguous},
          {{1, 1}, Layout::kContiguous}, {{}, Layout::kContiguous},        {{257}, Layout::kContiguous},
          {{100, 300}, Layout::kStep2}};
}

void check_unary(const std::vector<UnaryCase>& cases, DType dt, Device dev) {
  for (const auto& c : cases) {
    uint32_t seed = 7;
    for (const auto& in : unary_inputs()) {
      Tensor x = make_input(in.shape, in.layout, dt, dev, c.dom, seed++);
      run_case(c.name + " on " + layout_name(in.layout) + " " + describe(x), [&] {
        Tensor y = c.op(x);
        EXPECT_EQ(y.device(), x.device());
        EXPECT_EQ(y.dtype(), c.bool_out ? tg::kBool : dt);
        expect_close(y, ref_unary(RefTensor::from(x), c.ref), tol_for(dt));
      });
    }
  }
}

TEST_P(FloatOps, Unary) { check_unary(float_unary_cases(), dtype(), dev()); }
TEST_P(IntOps, Unary) { check_unary(int_unary_cases(), dtype(), dev()); }

struct BinaryCase {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
  Domain da, db;
  bool bool_out = false;
};

std::vector<BinaryCase> float_binary_cases() {
  Domain any{-2, 2}, nz{-2, 2, true}, pos{0.1, 3}, grid{-1, 1, false, 2};
  auto cmp = [&](std::string n, std::function<Tensor(const Tensor&, const Tensor&)> op,
                 std::function<bool(double, double)> r) {
    return BinaryCase{n, op, [r](double a, double b) { return double(r(a, b)); }, grid, grid, true};
  };
  return {
      {"a+b", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }, any,
       any},
      {"add(a,b,alpha=2)", [](const Tensor& a, const Tensor& b) { return tg::add(a, b, 2); },
       [](double a, double b) { return a + 2 * b; }, any, any},
      {"a-b", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }, any,
       any},
      {"sub(a,b,alpha=0.5)", [](const Tensor& a, const Tensor& b) { return tg::sub(a, b, 0.5); },
       [](double a, double b) { return a - 0.5 * b; }, any, any},
      {"a*b", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }, any,
       any},
      {"a/b", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }, any,
       nz},
      {"pow(a,b)", [](const Tensor& a, const Tensor& b) { return a.pow(b); },
       [](double a, double b) { return std::pow(a, b); }, pos, any},
      {"maximum", [](const Tensor& a, const Tensor& b) { return tg::maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }, grid, grid},
      {"minimum", [](const Tensor& a, const Tensor& b) { return tg::minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }, grid, grid},
      cmp(
          "a==b", [](const Tensor& a, const Tensor& b) { return a == b; }, [](double a, double b) { return a == b; }),
      cmp(
          "a!=b", [](const Tensor& a, const Tensor& b) { return a != b; }, [](double a, double b) { return a != b; }),
      cmp(
          "a<b", [](const Tensor& a, const Tensor& b) { return a < b; }, [](double a, double b) { return a < b; }),
      cmp(
          "a<=b", [](const Tensor& a, const Tensor& b) { return a <= b; }, [](double a, double b) { return a <= b; }),
      cmp(
          "a>b", [](const Tensor& a, const Tensor& b) { return a > b; }, [](double a, double b) { return a > b; }),
      cmp(
          "a>=b", [](const Tensor& a, const Tensor& b) { return a >= b; }, [](double a, double b) { return a >= b; }),
      cmp(
          "eq()", [](const Tensor& a, const Tensor& b) { return a.eq(b); }, [](double a, double b) { return a == b; }),
      cmp(
          "tg::ge", [](const Tensor& a, const Tensor& b) { return tg::ge(a, b); },
          [](double a, double b) { return a >= b; }),
  };
}

std::vector<BinaryCase> int_binary_cases() {
  Domain d{-20, 20}, g{-3, 3};
  return {
      {"a+b", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }, d, d},
      {"add(a,b,alpha=3)", [](const Tensor& a, const Tensor& b) { return tg::add(a, b, 3); },
       [](double a, double b) { return a + 3 * b; }, d, d},
      {"a-b", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }, d, d},
      {"a*b", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }, d, d},
      {"maximum", [](const Tensor& a, const Tensor& b) { return tg::maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }, g, g},
      {"minimum", [](const Tensor& a, const Tensor& b) { return tg::minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }, g, g},
      {"a==b", [](const Tensor& a, const Tensor& b) { return a == b; },
       [](double a, double b) { return double(a == b); }, g, g, true},
      {"a<b", [](const Tensor& a, const Tensor& b) { return a < b; }, [](double a, double b) { return double(a < b); },
       g, g, true},
      {"a>=b", [](const Tensor& a, const Tensor& b) { return a >= b; },
       [](double a, double b) { return double(a >= b); }, g, g, true},
  };
}

struct BinaryInput {
  Dims sa;
  Layout la;
  Dims sb;
  Layout lb;
};
std::vector<BinaryInput> binary_inputs() {
  using L = Layout;
  return {
      {{3, 5}, L::kContiguous, {3, 5}, L::kContiguous},
      {{3, 5}, L::kTransposed, {3, 5}, L::kTransposed},
      {{3, 5}, L::kStep2, {3, 5}, L::kStep2},
      {{3, 5}, L::kExpanded, {3, 5}, L::kExpanded},
      {{3, 5}, L::kStep2, {3, 5}, L::kTransposed},
      {{3, 1}, L::kContiguous, {1, 5}, L::kContiguous},  // both sides broadcast
      {{5}, L::kContiguous, {3, 5}, L::kTransposed},     // fewer dims
      {{}, L::kContiguous, {3, 5}, L::kStep2},           // 0-d on the left
      {{3, 5}, L::kExpanded, {}, L::kContiguous},        // 0-d on the right
      {{0, 5}, L::kContiguous, {1, 5}, L::kContiguous},  // size-0 dim
      {{1, 1}, L::kContiguous, {1, 1}, L::kContiguous},
      {{2, 1, 4}, L::kTransposed, {3, 1}, L::kContiguous},
      {{}, L::kContiguous, {}, L::kContiguous},
      {{257}, L::kContiguous, {257}, L::kContiguous},
      {{64, 300}, L::kContiguous, {300}, L::kStep2},
  };
}

void check_binary(const std::vector<BinaryCase>& cases, DType dt, Device dev) {
  for (const auto& c : cases) {
    uint32_t seed = 11;
    for (const auto& in : binary_inputs()) {
      Tensor a = make_input(in.sa, in.la, dt, dev, c.da, seed++);
      Tensor b = make_input(in.sb, in.lb, dt, dev, c.db, seed++);
      run_case(c.name + " on " + describe(a) + " (" + layout_name(in.la) + ") and " + describe(b) + " (" +
                   layout_name(in.lb) + ")",
               [&] {
                 Tensor y = c.op(a, b);
                 EXPECT_EQ(y.dtype(), c.bool_out ? tg::kBool : dt);
                 expect_close(y, ref_binary(RefTensor::from(a), RefTensor::from(b), c.ref), tol_for(dt));
               });
    }
  }
}

TEST_P(FloatOps, Binary) { check_binary(float_binary_cases(), dtype(), dev()); }
TEST_P(IntOps, Binary) { check_binary(int_binary_cases(), dtype(), dev()); }

TEST_P(FloatOps, Where) {
  Domain any{-2, 2};
  Tensor a = make_input({3, 5}, Layout::kTransposed, dtype(), dev(), any, 1);
  Tensor b = make_input({3, 5}, Layout::kStep2, dtype(), dev(), any, 2);
  Tensor c = make_input({3, 5}, Layout::kContiguous, tg::kFloat32, dev(), any, 3) > 0.0;
  run_case("where same shapes", [&] {
    Tensor y = tg::where(c, a, b);
    EXPECT_EQ(y.dtype(), dtype());
    expect_close(y, ref_where(RefTensor::from(c), RefTensor::from(a), RefTensor::from(b)), 0, 0);
  });
  run_case("where broadcast cond [3, 1], a [1, 5], b 0-d", [&] {
    Tensor c1 = make_input({3, 1}, Layout::kContiguous, tg::kFloat32, dev(), any, 4) > 0.0;
    Tensor a1 = make_input({1, 5}, Layout::kContiguous, dtype(), dev(), any, 5);
    Tensor b1 = make_input({}, Layout::kContiguous, dtype(), dev(), any, 6);
    Tensor y = tg::where(c1, a1, b1);
    expect_close(y, ref_where(RefTensor::from(c1), RefTensor::from(a1), RefTensor::from(b1)), 0, 0);
  });
  run_case("where with empty", [&] {
    Tensor c0 = tg::zeros({0, 5}, tg::TensorOptions().dtype(tg::kBool).device(dev()));
    Tensor y = tg::where(c0, a.slice(0, 0, 0), b.slice(0, 0, 0));
    EXPECT_EQ(y.sizes(), tg::Shape({0, 5}));
  });
}

// ---------------------------------------------------------------- reductions

struct ReduceInput {
  Dims shape;
  Layout layout;
};
std::vector<ReduceInput> reduce_inputs() {
  return {{{3, 4, 5}, Layout::kContiguous}, {{3, 4, 5}, Layout::kTransposed}, {{3, 4, 5}, Layout::kStep2},
          {{3, 4, 5}, Layout::kExpanded},   {{1, 1}, Layout::kContiguous},    {{7}, Layout::kContiguous},
          {{40, 600}, Layout::kContiguous}, {{300, 40}, Layout::kTransposed}};
}
std::vector<Dims> dim_sets(int64_t nd) {
  std::vector<Dims> out{{}};
  for (int64_t d = 0; d < nd; ++d) out.push_back({d});
  if (nd >= 1) out.push_back({-1});
  if (nd >= 3) out.push_back({0, 2});
  if (nd >= 2) out.push_back({0, 1});
  if (nd >= 3) out.push_back({2, 0, 1});
  return out;
}
tg::DimList to_dimlist(const Dims& d) { return tg::DimList(std::vector<int64_t>(d.begin(), d.end())); }

// Reduced floats: the reduction runs in float and rounds once, so the output
// tolerance is the dtype's; float32 sums of up to 24000 positive values add
// about log2(n) * 2^-24 of relative error with pairwise/blocked summation, and
// up to n * 2^-24 (1.4e-3) with a naive loop, so allow 2e-4 (one rounding per
// ~50 adds beyond that would be a real accuracy problem).
Tol reduce_tol(DType dt) {
  Tol t = tol_for(dt);
  if (dt == tg::kFloat32) t.rtol = 2e-4;
  return t;
}

TEST_P(FloatOps, Reductions) {
  Domain pos{0.5, 1.5};
  uint32_t seed = 21;
  for (const auto& in : reduce_inputs()) {
    Tensor x = make_input(in.shape, in.layout, dtype(), dev(), pos, seed++);
    RefTensor rx = RefTensor::from(x);
    std::string where = std::string(layout_name(in.layout)) + " " + describe(x);
    Tol tol = reduce_tol(dtype());
    run_case("sum() on " + where, [&] {
      Tensor y = x.sum();
      EXPECT_EQ(y.dim(), 0);
      expect_close(y, ref_reduce(rx, {}, false, ref_sum_of), tol);
    });
    run_case("mean() on " + where, [&] { expect_close(x.mean(), ref_reduce(rx, {}, false, ref_mean_of), tol); });
    run_case("var() on " + where, [&] {
      if (x.numel() > 1)
        expect_close(x.var(), ref_reduce(rx, {}, false, [](auto& v) { return ref_var_of(v, 1); }), tol);
    });
    run_case("std() on " + where, [&] {
      if (x.numel() > 1)
        expect_close(x.std(), ref_reduce(rx, {}, false, [](auto& v) { return std::sqrt(ref_var_of(v, 1)); }), tol);
    });
    run_case("max()/min() on " + where, [&] {
      expect_close(x.max(), ref_reduce(rx, {}, false, ref_max_of), 0, 0);
      expect_close(x.min(), ref_reduce(rx, {}, false, ref_min_of), 0, 0);
    });
    for (const Dims& ds : dim_sets(x.dim())) {
      for (bool keep : {false, true}) {
        std::string what = " over " + dims_str(ds) + (keep ? " keepdim" : "") + " on " + where;
        tg::DimList dl = to_dimlist(ds);
        run_case("sum" + what, [&] { expect_close(x.sum(dl, keep), ref_reduce(rx, ds, keep, ref_sum_of), tol); });
        run_case("tg::sum" + what,
                 [&] { expect_close(tg::sum(x, dl, keep), ref_reduce(rx, ds, keep, ref_sum_of), tol); });
        run_case("mean" + what, [&] { expect_close(x.mean(dl, keep), ref_reduce(rx, ds, keep, ref_mean_of), tol); });
        for (int64_t corr : {0, 1}) {
          run_case("var/std correction " + std::to_string(corr) + what, [&] {
            RefTensor probe = ref_reduce(rx, ds, keep, [](auto& v) { return double(v.size()); });
            if (!probe.v.empty() && probe.v[0] <= corr) return;  // n - correction <= 0: nan/inf, not tested here
            expect_close(x.var(dl, keep, corr), ref_reduce(rx, ds, keep, [&](auto& v) { return ref_var_of(v, corr); }),
                         tol);
            expect_close(x.std(dl, keep, corr),
                         ref_reduce(rx, ds, keep, [&](auto& v) { return std::sqrt(ref_var_of(v, corr)); }), tol);
          });
        }
        run_case("max/min (amax/amin)" + what, [&] {
          expect_close(x.max(dl, keep), ref_reduce(rx, ds, keep, ref_max_of), 0, 0);
          expect_close(x.min(dl, keep), ref_reduce(rx, ds, keep, ref_min_of), 0, 0);
          expect_close(tg::amax(x, dl, keep), ref_reduce(rx, ds, keep, ref_max_of), 0, 0);
          expect_close(tg::amin(x, dl, keep), ref_reduce(rx, ds, keep, ref_min_of), 0, 0);
        });
      }
    }
  }
}

// Reductions with mixed signs: cancellation makes relative error meaningless,
// so the bound is absolute, scaled by sum |x| (what the rounding errors scale with).
TEST_P(FloatOps, SumMixedSigns) {
  Tensor x = make_input({50, 70}, Layout::kTransposed, dtype(), dev(), {-2, 2}, 5);
  RefTensor rx = RefTensor::from(x);
  double l1 = 0;
  for (double v : rx.v) l1 += std::abs(v);
  Tol t = tol_for(dtype());
  double atol = t.rtol * l1 / 50;  // per output, about sum|x| over one reduced row
  expect_close(x.sum(0), ref_reduce(rx, {0}, false, ref_sum_of), atol, t.rtol);
  expect_close(x.sum(1), ref_reduce(rx, {1}, false, ref_sum_of), atol, t.rtol);
  expect_close(x.sum(), ref_reduce(rx, {}, false, ref_sum_of), t.rtol * l1, t.rtol);
}

TEST_P(FloatOps, ReduceEmptyAndZeroDim) {
  Tensor e = tg::zeros({0, 5}, tg::TensorOptions().dtype(dtype()).device(dev()));
  run_case("sum over a size-0 dim is 0", [&] {
    expect_close(e.sum(0), RefTensor({5}, 0.0), 0, 0);
    expect_close(e.sum(), RefTensor({}, 0.0), 0, 0);
  });
  run_case("sum over a non-empty dim of an empty tensor", [&] {
    Tensor y = e.sum(1);
    EXPECT_EQ(y.sizes(), tg::Shape({0}));
  });
  run_case("max over the non-empty dim of an empty tensor is empty",
           [&] { EXPECT_EQ(e.max(1).sizes(), tg::Shape({0})); });
  Tensor s = make_input({}, Layout::kContiguous, dtype(), dev(), {-2, 2}, 3);
  RefTensor rs = RefTensor::from(s);
  run_case("0-d reductions", [&] {
    expect_close(s.sum(), rs, 0, 0);
    expect_close(s.mean(), rs, tol_for(dtype()));
    expect_close(s.max(), rs, 0, 0);
    expect_close(s.argmax(), RefTensor({}, 0.0), 0, 0);
  });
}

TEST_P(FloatOps, Argmax) {
  Domain distinct;
  distinct.distinct = true;
  uint32_t seed = 31;
  for (const auto& in : std::vector<ReduceInput>{{{3, 4, 5}, Layout::kContiguous},
                                                 {{3, 4, 5}, Layout::kTransposed},
                                                 {{3, 4, 5}, Layout::kStep2},
                                                 {{3, 4, 5}, Layout::kExpanded},
                                                 {{1}, Layout::kContiguous},
                                                 {{100}, Layout::kContiguous}}) {
    Tensor x = make_input(in.shape, in.layout, dtype(), dev(), distinct, seed++);
    RefTensor rx = RefTensor::from(x);
    std::string where = std::string(layout_name(in.layout)) + " " + describe(x);
    run_case("argmax() on " + where, [&] {
      Tensor y = x.argmax();
      EXPECT_EQ(y.dtype(), tg::kInt64);
      EXPECT_EQ(y.dim(), 0);
      expect_close(y, ref_reduce(rx, {}, false, ref_argmax_of), 0, 0);
    });
    for (int64_t d = -1; d < x.dim(); ++d)
      for (bool keep : {false, true})
        run_case("argmax(" + std::to_string(d) + (keep ? ", keepdim" : "") + ") on " + where, [&] {
          Tensor y = x.argmax(d, keep);
          EXPECT_EQ(y.dtype(), tg::kInt64);
          expect_close(y, ref_reduce(rx, {d}, keep, ref_argmax_of), 0, 0);
          expect_close(tg::argmax(x, d, keep), ref_reduce(rx, {d}, keep, ref_argmax_of), 0, 0);
        });
  }
}

TEST_P(IntOps, Reductions) {
  Domain d{-20, 20};
  uint32_t seed = 41;
  for (const auto& in : reduce_inputs()) {
    Tensor x = make_input(in.shape, in.layout, dtype(), dev(), d, seed++);
    RefTensor rx = RefTensor::from(x);
    std::string where = std::string(layout_name(in.layout)) + " " + describe(x);
    run_case("sum()/max()/min() on " + where, [&] {
      expect_close(x.sum(), ref_reduce(rx, {}, false, ref_sum_of), 0, 0);
      expect_close(x.max(), ref_reduce(rx, {}, false, ref_max_of), 0, 0);
      expect_close(x.min(), ref_reduce(rx, {}, false, ref_min_of), 0, 0);
    });
    for (const Dims& ds : dim_sets(x.dim()))
      for (bool keep : {false, true})
        run_case("sum/max/min over " + dims_str(ds) + (keep ? " keepdim" : "") + " on " + where, [&] {
          tg::DimList dl = to_dimlist(ds);
          expect_close(x.sum(dl, keep), ref_reduce(rx, ds, keep, ref_sum_of), 0, 0);
          expect_close(x.max(dl, keep), ref_reduce(rx, ds, keep, ref_max_of), 0, 0);
          expect_close(x.min(dl, keep), ref_reduce(rx, ds, keep, ref_min_of), 0, 0);
        });
  }
  Domain distinct;
  distinct.distinct = true;
  Tensor x = make_input({3, 4, 5}, Layout::kTransposed, dtype(), dev(), distinct, 9);
  RefTensor rx = RefTensor::from(x);
  run_case("argmax", [&] {
    expect_close(x.argmax(), ref_reduce(rx, {}, false, ref_argmax_of), 0, 0);
    for (int64_t dd = 0; dd < 3; ++dd) expect_close(x.argmax(dd), ref_reduce(rx, {dd}, false, ref_argmax_of), 0, 0);
  });
}

TEST(Reductions, ArgmaxTiesGiveFirstIndex) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    Tensor x = tg::tensor(std::vector<float>{1, 3, 3, 2, 3, 0}, {2, 3}).to(dev);
    EXPECT_EQ(x.argmax().item<int64_t>(), 1);
    EXPECT_EQ(x.argmax(1).to_vector<int64_t>(), (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(x.argmax(0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  }
}

TEST(Reductions, IntSumIsInt64AndMeanOfFloat) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    Tensor x = tg::tensor(std::vector<int32_t>{1, 2, 3, 4}, {2, 2}).to(dev);
    Tensor s = x.sum();
    EXPECT_EQ(s.dtype(), tg::kInt64);  // torch.sum promotes integral inputs to int64
    EXPECT_EQ(s.item<int64_t>(), 10);
    Tensor b = tg::tensor(std::vector<bool>{true, false, true}, {3}).to(dev);
    EXPECT_EQ(b.sum().dtype(), tg::kInt64);
    EXPECT_EQ(b.sum().item<int64_t>(), 2);
  }
}

// ---------------------------------------------------------------- matmul

struct MatmulInput {
  std::string name;
  Dims sa;
  Layout la;
  Dims sb;
  Layout lb;
};

TEST_P(FloatOps, Matmul) {
  using L = Layout;
  std::vector<MatmulInput> cases = {
      {"1-D . 1-D", {7}, L::kContiguous, {7}, L::kContiguous},
      {"2-D . 1-D", {3, 7}, L::kContiguous, {7}, L::kContiguous},
      {"1-D . 2-D", {7}, L::kContiguous, {7, 4}, L::kContiguous},
      {"2-D . 2-D", {3, 7}, L::kContiguous, {7, 4}, L::kContiguous},
      {"2-D^T . 2-D", {3, 7}, L::kTransposed, {7, 4}, L::kContiguous},
      {"2-D . 2-D^T", {3, 7}, L::kContiguous, {7, 4}, L::kTransposed},
      {"2-D^T . 2-D^T", {3, 7}, L::kTransposed, {7, 4}, L::kTransposed},
      {"strided . strided", {3, 7}, L::kStep2, {7, 4}, L::kStep2},
      {"2-D . 1-D strided", {5, 6}, L::kTransposed, {6}, L::kStep2},
      {"3-D . 3-D", {2, 3, 7}, L::kContiguous, {2, 7, 4}, L::kContiguous},
      {"3-D^T . 3-D^T", {2, 3, 7}, L::kTransposed, {2, 7, 4}, L::kTransposed},
      {"3-D . 2-D", {2, 3, 7}, L::kContiguous, {7, 4}, L::kContiguous},
      {"2-D . 3-D", {3, 7}, L::kContiguous, {2, 7, 4}, L::kContiguous},
      {"broadcast batch [2,1,3,7] . [5,7,4]", {2, 1, 3, 7}, L::kContiguous, {5, 7, 4}, L::kContiguous},
      {"expanded batch", {2, 3, 7}, L::kExpanded, {2, 7, 4}, L::kContiguous},
      {"3-D . 1-D", {2, 3, 7}, L::kContiguous, {7}, L::kContiguous},
      {"1-D . 3-D", {7}, L::kContiguous, {2, 7, 4}, L::kContiguous},
      {"k = 0", {3, 0}, L::kContiguous, {0, 4}, L::kContiguous},
      {"m = 0", {0, 7}, L::kContiguous, {7, 4}, L::kContiguous},
      {"larger 65x130 . 130x33", {65, 130}, L::kContiguous, {130, 33}, L::kTransposed},
  };
  Domain d{-1, 1};
  uint32_t seed = 51;
  for (const auto& c : cases) {
    Tensor a = make_input(c.sa, c.la, dtype(), dev(), d, seed++);
    Tensor b = make_input(c.sb, c.lb, dtype(), dev(), d, seed++);
    run_case("matmul " + c.name + ": " + describe(a) + " . " + describe(b), [&] {
      Tensor y = tg::matmul(a, b);
      EXPECT_EQ(y.dtype(), dtype());
      EXPECT_EQ(y.device(), a.device());
      // Each output sums k products of |x| <= 1: rounding error scales with k, not with the
      // (possibly cancelled) result, so the absolute bound is rtol * k.
      int64_t k = c.sa.back();
      Tol t = tol_for(dtype());
      RefTensor want = ref_matmul(RefTensor::from(a), RefTensor::from(b));
      expect_close(y, want, t.atol + t.rtol * static_cast<double>(std::max<int64_t>(k, 1)), t.rtol);
      expect_close(a.matmul(b), want, t.atol + t.rtol * static_cast<double>(std::max<int64_t>(k, 1)), t.rtol);
    });
  }
}

// ---------------------------------------------------------------- views

TEST_P(FloatOps, ViewsMatchReferenceAndShareStorage) {
  Tensor base = make_input({4, 6}, Layout::kContiguous, dtype(), dev(), {-2, 2}, 61);
  RefTensor rb = RefTensor::from(base);
  auto idx = [&](int64_t i, int64_t j) { return rb.v[i * 6 + j]; };
  run_case("view/reshape", [&] {
    Tensor v = base.view({2, 12});
    EXPECT_EQ(v.sizes(), tg::Shape({2, 12}));
    expect_close(v, RefTensor({2, 12}, rb.v), 0, 0);
    expect_close(base.view({-1}), RefTensor({24}, rb.v), 0, 0);
    expect_close(base.reshape({3, -1}), RefTensor({3, 8}, rb.v), 0, 0);
    expect_close(tg::reshape(base, {24}), RefTensor({24}, rb.v), 0, 0);
    // reshape of a transposed tensor must copy, with values in the transposed order.
    Tensor r = base.t().reshape({24});
    RefTensor want({24});
    for (int64_t j = 0; j < 6; ++j)
      for (int64_t i = 0; i < 4; ++i) want.v[j * 4 + i] = idx(i, j);
    expect_close(r, want, 0, 0);
  });
  run_case("transpose/t/permute", [&] {
    RefTensor want({6, 4});
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 6; ++j) want.v[j * 4 + i] = idx(i, j);
    expect_close(base.t(), want, 0, 0);
    expect_close(base.transpose(0, 1), want, 0, 0);
    expect_close(base.transpose(-1, -2), want, 0, 0);
    expect_close(base.permute({1, 0}), want, 0, 0);
    expect_close(tg::transpose(base, 0, 1), want, 0, 0);
    Tensor b3 = base.view({2, 3, 4});
    Tensor p = b3.permute({2, 0, 1});
    EXPECT_EQ(p.sizes(), tg::Shape({4, 2, 3}));
    RefTensor wp({4, 2, 3});
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t c = 0; c < 4; ++c) wp.v[c * 6 + a * 3 + b] = rb.v[a * 12 + b * 4 + c];
    expect_close(p, wp, 0, 0);
    expect_close(p.contiguous(), wp, 0, 0);
  });
  run_case("slice with step / select / narrow", [&] {
    Tensor s = base.slice(1, 1, 6, 2);  // columns 1, 3, 5
    EXPECT_EQ(s.sizes(), tg::Shape({4, 3}));
    RefTensor want({4, 3});
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 3; ++j) want.v[i * 3 + j] = idx(i, 1 + 2 * j);
    expect_close(s, want, 0, 0);
    Tensor r = base.slice(0, 1, 3);
    expect_close(r, RefTensor({2, 6}, std::vector<double>(rb.v.begin() + 6, rb.v.begin() + 18)), 0, 0);
    Tensor neg = base.slice(0, -2, 4);  // negative start wraps, like Python
    EXPECT_EQ(neg.sizes(), tg::Shape({2, 6}));
    expect_close(neg, RefTensor({2, 6}, std::vector<double>(rb.v.begin() + 12, rb.v.end())), 0, 0);
    Tensor sel = base.select(1, 2);
    RefTensor ws({4});
    for (int64_t i = 0; i < 4; ++i) ws.v[i] = idx(i, 2);
    expect_close(sel, ws, 0, 0);
    expect_close(base.select(0, -1), RefTensor({6}, std::vector<double>(rb.v.begin() + 18, rb.v.end())), 0, 0);
    expect_close(base.narrow(1, 2, 3).select(0, 0),
                 RefTensor({3}, std::vector<double>(rb.v.begin() + 2, rb.v.begin() + 5)), 0, 0);
  });
  run_case("unsqueeze/squeeze/expand", [&] {
    EXPECT_EQ(base.unsqueeze(0).sizes(), tg::Shape({1, 4, 6}));
    EXPECT_EQ(base.unsqueeze(1).sizes(), tg::Shape({4, 1, 6}));
    EXPECT_EQ(base.unsqueeze(-1).sizes(), tg::Shape({4, 6, 1}));
    expect_close(base.unsqueeze(1), RefTensor({4, 1, 6}, rb.v), 0, 0);
    Tensor u = base.unsqueeze(0).unsqueeze(2);
    EXPECT_EQ(u.squeeze().sizes(), tg::Shape({4, 6}));
    EXPECT_EQ(u.squeeze(2).sizes(), tg::Shape({1, 4, 6}));
    EXPECT_EQ(u.squeeze(1).sizes(), tg::Shape({1, 4, 1, 6}));  // not size 1: unchanged, as PyTorch
    expect_close(u.squeeze(), RefTensor({4, 6}, rb.v), 0, 0);
    Tensor row = base.select(0, 1).unsqueeze(0);  // [1, 6]
    Tensor e = row.expand({3, 6});
    RefTensor we({3, 6});
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 6; ++j) we.v[i * 6 + j] = idx(1, j);
    expect_close(e, we, 0, 0);
    EXPECT_EQ(e.stride(0), 0);
    Tensor e2 = row.expand({2, 3, 6});  // new leading dims
    EXPECT_EQ(e2.sizes(), tg::Shape({2, 3, 6}));
    EXPECT_EQ(row.expand({-1, 6}).sizes(), tg::Shape({1, 6}));  // -1 keeps the size
  });
  run_case("writing through views changes the base", [&] {
    Tensor b = base.clone();
    b.select(0, 2).fill_(7);
    b.slice(1, 0, 6, 3).mul_(0);  // columns 0 and 3
    b.t().select(0, 5).add_(1);   // column 5
    b.view({24}).slice(0, 0, 1).fill_(-1);
    RefTensor want = rb;
    for (int64_t j = 0; j < 6; ++j) want.v[2 * 6 + j] = 7;
    for (int64_t i = 0; i < 4; ++i) {
      want.v[i * 6 + 0] = 0;
      want.v[i * 6 + 3] = 0;
    }
    for (int64_t i = 0; i < 4; ++i) want.v[i * 6 + 5] = converted(want.v[i * 6 + 5] + 1, b.dtype());
    want.v[0] = -1;
    expect_close(b, want, 0, 0);
  });
  run_case("views share the storage pointer", [&] {
    auto* p = static_cast<char*>(base.data_ptr());
    size_t es = base.element_size();
    EXPECT_EQ(base.view({24}).data_ptr(), base.data_ptr());
    EXPECT_EQ(base.t().data_ptr(), base.data_ptr());
    EXPECT_EQ(base.select(0, 1).data_ptr(), static_cast<void*>(p + 6 * es));
    EXPECT_EQ(base.slice(1, 2, 6).data_ptr(), static_cast<void*>(p + 2 * es));
    EXPECT_EQ(base.slice(1, 2, 6).storage_offset(), 2);
    EXPECT_EQ(base.unsqueeze(0).data_ptr(), base.data_ptr());
  });
}

TEST_P(FloatOps, IndexSelect) {
  Tensor x = make_input({5, 4}, Layout::kTransposed, dtype(), dev(), {-2, 2}, 71);
  RefTensor rx = RefTensor::from(x);
  for (DType it : {tg::kInt64, tg::kInt32}) {
    Tensor idx = tg::tensor(std::vector<int64_t>{4, 0, 0, 2}, {4}).to(it).to(dev());
    run_case(std::string("index_select dim 0, index ") + tg::dtype_name(it), [&] {
      Tensor y = x.index_select(0, idx);
      RefTensor want({4, 4});
      int64_t rows[] = {4, 0, 0, 2};
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 4; ++j) want.v[i * 4 + j] = rx.v[rows[i] * 4 + j];
      expect_close(y, want, 0, 0);
      // a copy, not a view
      y.fill_(0);
      expect_close(x, rx, 0, 0);
    });
    run_case(std::string("index_select dim 1 / -1, index ") + tg::dtype_name(it), [&] {
      Tensor i1 = idx.slice(0, 1, 4);  // 0, 0, 2
      Tensor y = tg::index_select(x, 1, i1);
      RefTensor want({5, 3});
      int64_t cols[] = {0, 0, 2};
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < 3; ++j) want.v[i * 3 + j] = rx.v[i * 4 + cols[j]];
      expect_close(y, want, 0, 0);
      expect_close(x.index_select(-1, i1), want, 0, 0);
    });
  }
  run_case("index_select with an empty index", [&] {
    Tensor e = tg::zeros({0}, tg::TensorOptions().dtype(tg::kInt64).device(dev()));
    EXPECT_EQ(x.index_select(0, e).sizes(), tg::Shape({0, 4}));
  });
}

// ---------------------------------------------------------------- in place

TEST_P(FloatOps, InPlace) {
  Domain d{-2, 2}, nz{-2, 2, true};
  Tol t = tol_for(dtype());
  // In-place results are stored in self's dtype; round the reference the same way
  // by reading it back through a tensor of that dtype.
  auto check = [&](const std::string& name, std::function<void(const Tensor&, const Tensor&)> op,
                   std::function<double(double, double)> ref, Dims sb, Layout lb, Domain db) {
    run_case(name, [&] {
      Tensor self = make_input({3, 5}, Layout::kContiguous, dtype(), dev(), d, 81);
      Tensor other = make_input(sb, lb, dtype(), dev(), db, 82);
      RefTensor want = ref_binary(RefTensor::from(self), RefTensor::from(other), ref);
      Tensor alias = self.view({15});
      uint32_t v0 = self.version();
      void* p0 = self.data_ptr();
      op(self, other);
      EXPECT_GT(self.version(), v0) << name << " did not bump the version counter";
      EXPECT_EQ(alias.version(), self.version()) << "views share one version counter";
      EXPECT_EQ(self.data_ptr(), p0);
      expect_close(self, want, t);
    });
  };
  check(
      "add_(t)", [](const Tensor& s, const Tensor& o) { s.add_(o); }, [](double a, double b) { return a + b; }, {3, 5},
      Layout::kTransposed, d);
  check(
      "add_(t, alpha=2) broadcast row", [](const Tensor& s, const Tensor& o) { s.add_(o, 2); },
      [](double a, double b) { return a + 2 * b; }, {5}, Layout::kStep2, d);
  check(
      "sub_(t)", [](const Tensor& s, const Tensor& o) { s.sub_(o); }, [](double a, double b) { return a - b; }, {3, 1},
      Layout::kContiguous, d);
  check(
      "mul_(t)", [](const Tensor& s, const Tensor& o) { s.mul_(o); }, [](double a, double b) { return a * b; }, {3, 5},
      Layout::kExpanded, d);
  check(
      "div_(t)", [](const Tensor& s, const Tensor& o) { s.div_(o); }, [](double a, double b) { return a / b; }, {3, 5},
      Layout::kStep2, nz);
  check(
      "add_(2.5)", [](const Tensor& s, const Tensor&) { s.add_(2.5); }, [](double a, double) { return a + 2.5; }, {},
      Layout::kContiguous, d);
  check(
      "sub_(1)", [](const Tensor& s, const Tensor&) { s.sub_(1); }, [](double a, double) { return a - 1; }, {},
      Layout::kContiguous, d);
  check(
      "mul_(-3)", [](const Tensor& s, const Tensor&) { s.mul_(-3.0); }, [](double a, double) { return a * -3; }, {},
      Layout::kContiguous, d);
  check(
      "div_(4)", [](const Tensor& s, const Tensor&) { s.div_(4.0); }, [](double a, double) { return a / 4; }, {},
      Layout::kContiguous, d);
  check(
      "zero_", [](const Tensor& s, const Tensor&) { s.zero_(); }, [](double, double) { return 0.0; }, {},
      Layout::kContiguous, d);
  check(
      "fill_(1.25)", [](const Tensor& s, const Tensor&) { s.fill_(1.25); }, [](double, double) { return 1.25; }, {},
      Layout::kContiguous, d);
  check(
      "copy_ from transposed", [](const Tensor& s, const Tensor& o) { s.copy_(o); }, [](double, double b) { return b; },
      {3, 5}, Layout::kTransposed, d);
  check(
      "copy_ broadcast row", [](const Tensor& s, const Tensor& o) { s.copy_(o); }, [](double, double b) { return b; },
      {5}, Layout::kStep2, d);

  run_case("in place on a non-contiguous view writes through to the base", [&] {
    Tensor base = make_input({4, 6}, Layout::kContiguous, dtype(), dev(), d, 83);
    RefTensor want = RefTensor::from(base);
    Tensor v = base.t().slice(0, 0, 6, 2);  // [3, 4], columns 0, 2, 4 of base
    uint32_t v0 = base.version();
    v.mul_(2.0);
    v.add_(tg::ones({4}, tg::TensorOptions().dtype(dtype()).device(dev())));
    EXPECT_GT(base.version(), v0);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 6; j += 2) want.v[i * 6 + j] = converted(want.v[i * 6 + j] * 2 + 1, dtype());
    expect_close(base, want, t);
  });
}

TEST_P(FloatOps, CopyWithDtypeConversion) {
  for (DType src_t : {tg::kFloat32, tg::kFloat64, tg::kFloat16, tg::kBFloat16, tg::kInt32, tg::kInt64}) {
    run_case(std::string("copy_ from ") + tg::dtype_name(src_t) + " transposed", [&] {
      Domain dd{-8, 8, false, 4};  // multiples of 1/4: exact in every float dtype
      Tensor src = make_input({3, 5}, Layout::kTransposed, src_t, Device(tg::kCPU), dd, 91);
      Tensor dst = tg::zeros({3, 5}, tg::TensorOptions().dtype(dtype()).device(dev()));
      uint32_t v0 = dst.version();
      dst.copy_(src);  // from the CPU as well: copy_ crosses devices
      EXPECT_GT(dst.version(), v0);
      expect_close(dst, RefTensor::from(src), 0, 0);
      Tensor dst2 = tg::zeros({5, 3}, tg::TensorOptions().dtype(dtype()).device(dev())).t();
      dst2.copy_(src.to(dev()));  // non-contiguous destination
      expect_close(dst2, RefTensor::from(src), 0, 0);
    });
  }
}

// ---------------------------------------------------------------- copies and conversions

TEST_P(FloatOps, CloneContiguousDetach) {
  Tensor x = make_input({4, 6}, Layout::kTransposed, dtype(), dev(), {-2, 2}, 101);
  RefTensor rx = RefTensor::from(x);
  run_case("clone", [&] {
    Tensor c = x.clone();
    expect_close(c, rx, 0, 0);
    EXPECT_NE(c.data_ptr(), x.data_ptr());
    c.fill_(0);
    expect_close(x, rx, 0, 0);
  });
  run_case("contiguous", [&] {
    EXPECT_FALSE(x.is_contiguous());
    Tensor c = x.contiguous();
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_EQ(c.strides(), tg::Shape({6, 1}));
    expect_close(c, rx, 0, 0);
    Tensor cc = c.contiguous();  // already contiguous: the same storage, no copy
    EXPECT_EQ(cc.data_ptr(), c.data_ptr());
  });
  run_case("detach shares storage", [&] {
    Tensor dd = x.detach();
    EXPECT_EQ(dd.data_ptr(), x.data_ptr());
    EXPECT_EQ(dd.sizes(), x.sizes());
    EXPECT_EQ(dd.strides(), x.strides());
    expect_close(dd, rx, 0, 0);
  });
}

const std::vector<DType> kAllDTypes = {tg::kFloat32, tg::kFloat16, tg::kBFloat16, tg::kFloat64,
                                       tg::kInt64,   tg::kInt32,   tg::kBool};

TEST(Conversions, AllDtypePairs) {
  for (Device dev : devices()) {
    for (DType from : kAllDTypes) {
      // Values exact in every dtype (bool: zero / non-zero).
      std::vector<double> vals = {0, 1, -2, 3, 0, 7, -100, 2};
      if (from == tg::kBool)
        for (auto& v : vals) v = v != 0;
      Tensor src = tg::visit_dtype(from, [&](auto z) {
                     using T = decltype(z);
                     std::vector<T> h;
                     for (double v : vals) h.push_back(from_double<T>(v));
                     return tg::tensor(h, {2, 4});
                   }).to(dev);
      for (DType to : kAllDTypes) {
        run_case(std::string("to(") + tg::dtype_name(to) + ") from " + tg::dtype_name(from) + " on " + dev.str(), [&] {
          for (Tensor s : {src, src.t()}) {
            Tensor y = s.to(to);
            EXPECT_EQ(y.dtype(), to);
            EXPECT_EQ(y.device(), s.device());
            RefTensor want = RefTensor::from(s);
            for (auto& v : want.v) v = converted(v, to);
            expect_close(y, want, 0, 0);
          }
        });
      }
    }
  }
}

TEST(Conversions, FloatToIntTruncatesAndRounding) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    Tensor x = tg::tensor(std::vector<float>{2.5f, -1.5f, 0.99f, -0.99f, 7.f}, {5}).to(dev);
    EXPECT_EQ(x.to(tg::kInt64).to_vector<int64_t>(), (std::vector<int64_t>{2, -1, 0, 0, 7}));
    EXPECT_EQ(x.to(tg::kInt32).to_vector<int32_t>(), (std::vector<int32_t>{2, -1, 0, 0, 7}));
    auto bv = x.to(tg::kBool).to(tg::kInt32).to_vector<int32_t>();
    EXPECT_EQ(bv, (std::vector<int32_t>{1, 1, 1, 1, 1}));
    // float32 -> float16 / bfloat16 rounds to nearest even, like the reference conversions.
    std::vector<float> f = {1.0f + 1.0f / 4096, 1.0f + 3.0f / 4096, 1.0f / 3, 3.14159f, 65504.f, -0.1f};
    Tensor xf = tg::tensor(f, {6}).to(dev);
    RefTensor w16({6}), wbf({6});
    for (int i = 0; i < 6; ++i) {
      w16.v[i] = static_cast<float>(tg::Half(f[i]));
      wbf.v[i] = static_cast<float>(tg::BFloat16(f[i]));
    }
    expect_close(xf.to(tg::kFloat16), w16, 0, 0);
    expect_close(xf.to(tg::kBFloat16), wbf, 0, 0);
  }
}

TEST(Conversions, DeviceRoundTrips) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(tg::dtype_name(dt));
    Tensor x = make_input({3, 7}, Layout::kTransposed, dt, Device(tg::kCPU), {-5, 5}, 3);
    Tensor g = x.to(tg::kCUDA);
    EXPECT_TRUE(g.is_cuda());
    EXPECT_EQ(g.dtype(), dt);
    Tensor back = g.cpu();
    EXPECT_TRUE(back.is_cpu());
    expect_close(back, RefTensor::from(x), 0, 0);
    expect_close(x.cuda().t().cpu(), RefTensor::from(x.t()), 0, 0);
    Tensor g64 = x.to(Device(tg::kCUDA), tg::kFloat64);
    EXPECT_EQ(g64.dtype(), tg::kFloat64);
    expect_close(g64.cpu(), RefTensor::from(x), 0, 0);
  }
}

TEST(Conversions, ToSameIsNoCopy) {
  for (Device dev : devices()) {
    Tensor x = tg::ones({3}, dev);
    EXPECT_EQ(x.to(tg::kFloat32).data_ptr(), x.data_ptr());
    EXPECT_EQ(x.to(x.device()).data_ptr(), x.data_ptr());
  }
}

// ---------------------------------------------------------------- factories

TEST(Factories, ConstantsAndArange) {
  for (Device dev : devices()) {
    for (DType dt : kAllDTypes) {
      run_case(std::string("zeros/ones/full ") + tg::dtype_name(dt) + " " + dev.str(), [&] {
        auto o = tg::TensorOptions().dtype(dt).device(dev);
        Tensor z = tg::zeros({2, 3}, o), one = tg::ones({2, 3}, o), f = tg::full({4}, 3, o), e = tg::empty({2, 0}, o);
        EXPECT_EQ(z.dtype(), dt);
        EXPECT_EQ(z.device().type(), dev.type());
        EXPECT_TRUE(z.is_contiguous());
        expect_close(z, RefTensor({2, 3}, 0.0), 0, 0);
        expect_close(one, RefTensor({2, 3}, 1.0), 0, 0);
        expect_close(f, RefTensor({4}, dt == tg::kBool ? 1.0 : 3.0), 0, 0);
        EXPECT_EQ(e.numel(), 0);
        expect_close(tg::zeros({}, o), RefTensor({}, 0.0), 0, 0);
      });
    }
    SCOPED_TRACE(dev.str());
    Tensor f = tg::full({2}, 2.5, dev);
    EXPECT_EQ(f.dtype(), tg::kFloat32);
    expect_close(f, RefTensor({2}, 2.5), 0, 0);
    Tensor a = tg::arange(5, tg::TensorOptions().device(dev));
    EXPECT_EQ(a.dtype(), tg::kInt64);
    EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
    Tensor a0 = tg::arange(0, tg::TensorOptions().device(dev));
    EXPECT_EQ(a0.numel(), 0);
    Tensor b = tg::arange(1, 10, 3, tg::TensorOptions().dtype(tg::kInt64).device(dev));
    EXPECT_EQ(b.to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 7}));
    Tensor c = tg::arange(0.0, 1.0, 0.25, dev);
    EXPECT_EQ(c.dtype(), tg::kFloat32);
    expect_close(c, RefTensor({4}, {0, 0.25, 0.5, 0.75}), 0, 0);
    Tensor d = tg::arange(5.0, 2.0, -1.0, tg::TensorOptions().dtype(tg::kFloat64).device(dev));
    expect_close(d, RefTensor({3}, {5, 4, 3}), 0, 0);
    Tensor ai = tg::arange(2, 8, 2, dev);  // all-integer arguments: int64, as torch.arange
    EXPECT_EQ(ai.dtype(), tg::kInt64);
    expect_close(ai, RefTensor({3}, {2, 4, 6}), 0, 0);
  }
}

TEST(Factories, TensorFromVectorAndBlob) {
  Tensor t = tg::tensor(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.dtype(), tg::kFloat64);
  EXPECT_EQ(t.sizes(), tg::Shape({2, 3}));
  expect_close(t, RefTensor({2, 3}, {1, 2, 3, 4, 5, 6}), 0, 0);
  Tensor ti = tg::tensor(std::vector<int32_t>{1, -2, 3});
  EXPECT_EQ(ti.dtype(), tg::kInt32);
  EXPECT_EQ(ti.sizes(), tg::Shape({3}));
  Tensor tf = tg::tensor(std::vector<double>{1.5, 2.5}, {2}, tg::kFloat16);  // converted on the way in
  EXPECT_EQ(tf.dtype(), tg::kFloat16);
  expect_close(tf, RefTensor({2}, {1.5, 2.5}), 0, 0);
  Tensor tb = tg::tensor(std::vector<bool>{true, false, true}, {3});
  EXPECT_EQ(tb.dtype(), tg::kBool);
  expect_close(tb, RefTensor({3}, {1, 0, 1}), 0, 0);
  for (Device dev : devices()) {
    Tensor td = tg::tensor(std::vector<float>{1, 2}, {2}, dev);
    EXPECT_EQ(td.device().type(), dev.type());
    expect_close(td, RefTensor({2}, {1, 2}), 0, 0);
  }

  std::vector<float> host = {1, 2, 3, 4, 5, 6};
  Tensor b = tg::from_blob(host.data(), {2, 3});
  EXPECT_EQ(b.data_ptr(), static_cast<void*>(host.data()));  // no copy
  EXPECT_EQ(b.dtype(), tg::kFloat32);
  EXPECT_TRUE(b.is_cpu());
  host[4] = 50;
  EXPECT_EQ((b.accessor<float, 2>()[1][1]), 50.f);
  b.select(0, 0).fill_(9);
  EXPECT_EQ(host[0], 9.f);
  EXPECT_EQ(host[2], 9.f);
  EXPECT_EQ(host[3], 4.f);
  std::vector<int64_t> hi = {10, 20, 30, 40};
  Tensor bi = tg::from_blob(hi.data(), {2, 2}, tg::kInt64);
  EXPECT_EQ(bi.dtype(), tg::kInt64);
  EXPECT_EQ(bi.t().contiguous().to_vector<int64_t>(), (std::vector<int64_t>{10, 30, 20, 40}));
}

struct DeleterCount {
  int calls = 0;
};
void count_delete(void* ctx) { ++static_cast<DeleterCount*>(ctx)->calls; }

TEST(Factories, FromBlobWithStridesAndDeleter) {
  std::vector<float> host = {0, 1, 2, 3, 4, 5};
  DeleterCount dc;
  {
    Tensor b = tg::from_blob(host.data(), {3, 2}, {1, 3}, count_delete, &dc);  // a column-major view
    EXPECT_FALSE(b.is_contiguous());
    expect_close(b, RefTensor({3, 2}, {0, 3, 1, 4, 2, 5}), 0, 0);
    Tensor v = b.t();
    b = Tensor();
    EXPECT_EQ(dc.calls, 0);  // a view still holds the storage
    expect_close(v, RefTensor({2, 3}, {0, 1, 2, 3, 4, 5}), 0, 0);
  }
  EXPECT_EQ(dc.calls, 1);
}

TEST(Factories, ItemToVectorAccessor) {
  Tensor s = tg::full({}, 2.75, tg::kFloat64);
  EXPECT_EQ(s.item<double>(), 2.75);
  EXPECT_EQ(s.item<float>(), 2.75f);
  EXPECT_EQ(s.item<int64_t>(), 2);
  EXPECT_EQ(tg::full({1, 1}, 3, tg::kInt32).item<int32_t>(), 3);  // one element, any dims
  EXPECT_EQ(tg::full({}, true, tg::kBool).item<bool>(), true);
  EXPECT_DOUBLE_EQ(tg::full({}, 0.1, tg::kFloat16).item<double>(), static_cast<float>(tg::Half(0.1f)));
  EXPECT_EQ(tg::ones({}).item().to_double(), 1.0);
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    Tensor x = tg::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).to(dev);
    EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(x.t().to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));  // row-major of the view
    EXPECT_EQ(x.slice(1, 0, 3, 2).to_vector<float>(), (std::vector<float>{1, 3, 4, 6}));
    EXPECT_EQ(x.select(1, 2).select(0, 0).item<float>(), 3.f);
    EXPECT_EQ(x.select(0, 1).select(0, 2).item<float>(), 6.f);
  }
  Tensor x = tg::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  auto acc = x.accessor<float, 2>();
  EXPECT_EQ(acc.size(0), 2);
  EXPECT_EQ(acc.size(1), 3);
  EXPECT_EQ(acc[1][2], 6.f);
  acc[0][1] = 20;
  EXPECT_EQ(x.to_vector<float>()[1], 20.f);
  Tensor xt = x.t();                  // the accessor points at the view's sizes/strides: keep the view alive
  auto at = xt.accessor<float, 2>();  // strided
  EXPECT_EQ(at[2][1], 6.f);
  EXPECT_EQ(at[1][0], 20.f);
  Tensor row = x.select(0, 1);
  auto a1 = row.accessor<float, 1>();
  EXPECT_EQ(a1[0], 4.f);
}

TEST(Random, RandUniformAndSeeded) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    tg::manual_seed(123);
    Tensor r = tg::rand({100000}, dev);
    EXPECT_EQ(r.dtype(), tg::kFloat32);
    RefTensor rr = RefTensor::from(r);
    double lo = 1, hi = 0, m = 0;
    for (double v : rr.v) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      m += v;
    }
    m /= static_cast<double>(rr.v.size());
    EXPECT_GE(lo, 0.0);
    EXPECT_LT(hi, 1.0);
    EXPECT_NEAR(m, 0.5, 0.005);  // sd of the mean is 0.289 / sqrt(1e5) ~ 9e-4
    EXPECT_LT(lo, 1e-3);
    EXPECT_GT(hi, 1 - 1e-3);
    // every decile is populated evenly
    std::vector<int> hist(10);
    for (double v : rr.v) ++hist[std::min(9, static_cast<int>(v * 10))];
    for (int h : hist) EXPECT_NEAR(h, 10000, 600);

    tg::manual_seed(123);
    Tensor r2 = tg::rand({100000}, dev);
    EXPECT_EQ(r.to_vector<float>(), r2.to_vector<float>()) << "manual_seed must make rand reproducible";
    Tensor r3 = tg::rand({100000}, dev);
    EXPECT_NE(r2.to_vector<float>(), r3.to_vector<float>()) << "consecutive draws must differ";
    tg::manual_seed(124);
    std::vector<float> first16 = r.to_vector<float>();
    first16.resize(16);
    EXPECT_NE(tg::rand({16}, dev).to_vector<float>(), first16) << "another seed must give other values";
    for (DType dt : {tg::kFloat64, tg::kFloat16, tg::kBFloat16}) {
      Tensor rd = tg::rand({4000}, tg::TensorOptions().dtype(dt).device(dev));
      EXPECT_EQ(rd.dtype(), dt);
      RefTensor rv = RefTensor::from(rd);
      double s = 0;
      for (double v : rv.v) {
        EXPECT_GE(v, 0.0);
        EXPECT_LT(v, 1.0) << tg::dtype_name(dt) << " rand must stay below 1 after rounding";
        s += v;
      }
      EXPECT_NEAR(s / 4000, 0.5, 0.03);
    }
  }
}

TEST(Random, RandnMoments) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    tg::manual_seed(7);
    for (DType dt : {tg::kFloat32, tg::kFloat64}) {
      Tensor r = tg::randn({100000}, tg::TensorOptions().dtype(dt).device(dev));
      RefTensor rr = RefTensor::from(r);
      double m = ref_mean_of(rr.v), sd = std::sqrt(ref_var_of(rr.v, 1));
      EXPECT_NEAR(m, 0.0, 0.02);  // sd of the mean ~ 3.2e-3
      EXPECT_NEAR(sd, 1.0, 0.02);
      int within1 = 0;
      for (double v : rr.v) within1 += std::abs(v) < 1;
      EXPECT_NEAR(within1 / 1e5, 0.6827, 0.01);
    }
    tg::manual_seed(7);
    Tensor a = tg::randn({1000}, dev);
    tg::manual_seed(7);
    Tensor b = tg::randn({1000}, dev);
    EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  }
}

// In-place fills draw what the factories draw: after the same seed, normal_ / uniform_ of a
// dense tensor equal randn / rand of its shape (affinely mapped), and a strided view is filled
// in its logical order.
TEST(Random, InPlaceFillsMatchFactories) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    for (DType dt : {tg::kFloat32, tg::kFloat64, tg::kFloat16, tg::kBFloat16}) {
      SCOPED_TRACE(tg::dtype_name(dt));
      const auto opts = tg::TensorOptions().dtype(dt).device(dev);
      tg::manual_seed(11);
      Tensor want = tg::randn({33, 17}, opts);
      tg::manual_seed(11);
      Tensor got = tg::full({33, 17}, 5.0, opts);
      const uint32_t v0 = got.version();
      got.normal_();
      EXPECT_GT(got.version(), v0) << "normal_ must bump the version counter";
      EXPECT_EQ(got.to(tg::kFloat64).to_vector<double>(), want.to(tg::kFloat64).to_vector<double>());

      tg::manual_seed(12);
      Tensor u = tg::rand({33, 17}, opts.dtype(tg::kFloat64));
      tg::manual_seed(12);
      Tensor g2 = tg::empty({33, 17}, opts.dtype(tg::kFloat64));
      g2.uniform_(-2.0, 6.0);
      auto uv = u.to_vector<double>(), gv = g2.to_vector<double>();
      for (size_t i = 0; i < uv.size(); ++i) {
        ASSERT_GE(gv[i], -2.0);
        ASSERT_LT(gv[i], 6.0);
        ASSERT_NEAR(gv[i], -2.0 + 8.0 * uv[i], 1e-12) << i;
      }
    }
    // A transposed view: filled as randn of the view's shape, in logical order.
    tg::manual_seed(13);
    Tensor want = tg::randn({17, 33}, dev);
    tg::manual_seed(13);
    Tensor base = tg::zeros({33, 17}, dev);
    base.t().normal_(1.5, 0.25);
    auto bv = base.t().contiguous().to_vector<float>(), wv = want.to_vector<float>();
    for (size_t k = 0; k < wv.size(); ++k) ASSERT_NEAR(bv[k], wv[k] * 0.25 + 1.5, 1e-6) << k;
    // mean / std of a large fill
    Tensor big = tg::empty({200000}, dev);
    big.normal_(3.0, 2.0);
    RefTensor rb = RefTensor::from(big);
    EXPECT_NEAR(ref_mean_of(rb.v), 3.0, 0.03);
    EXPECT_NEAR(std::sqrt(ref_var_of(rb.v, 1)), 2.0, 0.03);
  }
}

TEST(Random, Randperm) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    for (int64_t n : {0, 1, 10, 1000}) {
      Tensor p = tg::randperm(n, tg::TensorOptions().dtype(tg::kInt64).device(dev));
      EXPECT_EQ(p.dtype(), tg::kInt64);
      EXPECT_EQ(p.sizes(), tg::Shape({n}));
      auto v = p.to_vector<int64_t>();
      std::vector<int64_t> sorted = v;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> want(static_cast<size_t>(n));
      std::iota(want.begin(), want.end(), 0);
      EXPECT_EQ(sorted, want);
      if (n == 1000) {
        EXPECT_NE(v, want) << "randperm(1000) returned the identity";
      }
    }
    tg::manual_seed(5);
    auto a = tg::randperm(50, dev).to_vector<int64_t>();
    tg::manual_seed(5);
    auto b = tg::randperm(50, dev).to_vector<int64_t>();
    EXPECT_EQ(a, b);
  }
}

TEST(Random, CudaRandEqualsCpuRandBitForBit) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t n : {1, 7, 1000, 100003}) {
    SCOPED_TRACE(n);
    tg::manual_seed(2024);
    auto cpu = tg::rand({n}).to_vector<float>();
    tg::manual_seed(2024);
    auto gpu = tg::rand({n}, tg::kCUDA).to_vector<float>();
    ASSERT_EQ(cpu.size(), gpu.size());
    int64_t first_diff = -1;
    for (size_t i = 0; i < cpu.size(); ++i)
      if (std::memcmp(&cpu[i], &gpu[i], sizeof(float)) != 0) {
        first_diff = static_cast<int64_t>(i);
        break;
      }
    EXPECT_EQ(first_diff, -1) << "cpu " << cpu[first_diff < 0 ? 0 : first_diff] << " vs cuda "
                              << gpu[first_diff < 0 ? 0 : first_diff];
  }
}

// ---------------------------------------------------------------- printing

TEST(Printing, TensorAndSizes) {
  Tensor x = tg::tensor(std::vector<float>{1, 2, 3, 4}, {2, 2});
  std::ostringstream os;
  os << x;
  std::string s = os.str();
  EXPECT_NE(s.find("tensor("), std::string::npos) << s;
  EXPECT_NE(s.find("[[1., 2.],"), std::string::npos) << s;
  EXPECT_NE(s.find("[3., 4.]]"), std::string::npos) << s;
  std::ostringstream oi;
  oi << tg::tensor(std::vector<int64_t>{1, 2, 3});
  EXPECT_NE(oi.str().find("[1, 2, 3]"), std::string::npos) << oi.str();
  std::ostringstream od;
  od << tg::tensor(std::vector<double>{0.5, 1.5});
  EXPECT_NE(od.str().find("0.5000"), std::string::npos) << od.str();
  EXPECT_NE(od.str().find("float64"), std::string::npos) << "non-default dtype is named: " << od.str();
  std::ostringstream ss;
  ss << tg::zeros({2, 3}).sizes();
  EXPECT_EQ(ss.str(), "[2, 3]");
  std::ostringstream se;
  se << tg::zeros({}).sizes();
  EXPECT_EQ(se.str(), "[]");
  std::ostringstream s0;
  s0 << tg::full({}, 3.0);  // 0-d: tensor(3.)
  EXPECT_NE(s0.str().find("3."), std::string::npos) << s0.str();
  if (tg::cuda::is_available()) {
    std::ostringstream oc;
    oc << tg::ones({2}, tg::kCUDA);
    EXPECT_NE(oc.str().find("cuda"), std::string::npos) << oc.str();
  }
}

// ---------------------------------------------------------------- type promotion

TEST(Promotion, PyTorchRules) {
  for (Device dev : devices()) {
    SCOPED_TRACE(dev.str());
    auto o = [&](DType t) { return tg::TensorOptions().dtype(t).device(dev); };
    Tensor i32 = tg::full({3}, 3, o(tg::kInt32)), i64 = tg::full({3}, 2, o(tg::kInt64));
    Tensor f16 = tg::full({3}, 1.5, o(tg::kFloat16)), f32 = tg::full({3}, 0.25, o(tg::kFloat32));
    Tensor bf16 = tg::full({3}, 2.0, o(tg::kBFloat16));
    run_case("int32 + int64 -> int64", [&] {
      Tensor y = i32 + i64;
      EXPECT_EQ(y.dtype(), tg::kInt64);
      expect_close(y, RefTensor({3}, 5.0), 0, 0);
    });
    run_case("int64 + 2.5 -> float32", [&] {
      Tensor y = i64 + 2.5;
      EXPECT_EQ(y.dtype(), tg::kFloat32);
      expect_close(y, RefTensor({3}, 4.5), 0, 0);
    });
    run_case("int32 * 2 stays int32", [&] {
      Tensor y = i32 * 2;
      EXPECT_EQ(y.dtype(), tg::kInt32);
      expect_close(y, RefTensor({3}, 6.0), 0, 0);
    });
    run_case("float16 + float32 -> float32", [&] {
      Tensor y = f16 + f32;
      EXPECT_EQ(y.dtype(), tg::kFloat32);
      expect_close(y, RefTensor({3}, 1.75), 0, 0);
    });
    run_case("bfloat16 + float16 -> float32", [&] {
      Tensor y = bf16 + f16;
      EXPECT_EQ(y.dtype(), tg::kFloat32);
      expect_close(y, RefTensor({3}, 3.5), 0, 0);
    });
    run_case("int64 / int64 -> float32 (true division)", [&] {
      Tensor y = tg::full({2}, 7, o(tg::kInt64)) / i64.slice(0, 0, 2);
      EXPECT_EQ(y.dtype(), tg::kFloat32);
      expect_close(y, RefTensor({2}, 3.5), 0, 0);
      Tensor z = i64 / 4;
      EXPECT_EQ(z.dtype(), tg::kFloat32);
      expect_close(z, RefTensor({3}, 0.5), 0, 0);
    });
    run_case("comparisons -> bool", [&] {
      EXPECT_EQ((i32 > i64).dtype(), tg::kBool);
      EXPECT_EQ((f16 < f32).dtype(), tg::kBool);
      EXPECT_EQ((f32 == 0.25).dtype(), tg::kBool);
      expect_close(i32 > i64, RefTensor({3}, 1.0), 0, 0);
      expect_close(f16 < f32, RefTensor({3}, 0.0), 0, 0);  // mixed dtypes compare in the promoted type
    });
    run_case("float16 * 2.0 stays float16; bfloat16 + 1 stays bfloat16", [&] {
      Tensor y = f16 * 2.0;
      EXPECT_EQ(y.dtype(), tg::kFloat16);
      expect_close(y, RefTensor({3}, 3.0), 0, 0);
      EXPECT_EQ((bf16 + 1).dtype(), tg::kBFloat16);
      EXPECT_EQ((2.0 / f16).dtype(), tg::kFloat16);
    });
    run_case("float32 with a 0-d float64 tensor stays float32", [&] {
      // A 0-d tensor takes part like a scalar of its category (PyTorch's result_type).
      Tensor y = f32 + tg::full({}, 1.0, o(tg::kFloat64));
      EXPECT_EQ(y.dtype(), tg::kFloat32);
    });
    run_case("exp / sqrt of ints -> float32", [&] {
      Tensor e = tg::full({2}, 4, o(tg::kInt64)).sqrt();
      EXPECT_EQ(e.dtype(), tg::kFloat32);
      expect_close(e, RefTensor({2}, 2.0), 0, 0);
      EXPECT_EQ(i32.exp().dtype(), tg::kFloat32);
    });
    run_case("float64 stays float64 with a float scalar",
             [&] { EXPECT_EQ((tg::ones({2}, o(tg::kFloat64)) * 0.1).dtype(), tg::kFloat64); });
  }
}

// ---------------------------------------------------------------- instantiation

std::vector<DevDType> grid(std::initializer_list<DType> dts) {
  std::vector<DevDType> out;
  for (auto dev : {tg::kCPU, tg::kCUDA})
    for (DType dt : dts) out.push_back({dev, dt});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Core, FloatOps,
                         ::testing::ValuesIn(grid({tg::kFloat32, tg::kFloat64, tg::kFloat16, tg::kBFloat16})),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Core, IntOps, ::testing::ValuesIn(grid({tg::kInt32, tg::kInt64})), param_name);

}  // namespace

namespace {
// The harness itself must catch a wrong value, a wrong shape and a NaN.
TEST(Harness, DetectsMismatches) {
  Tensor x = tg::tensor(std::vector<float>{1, 2, 3}, {3});
  EXPECT_TRUE(close_to(x, RefTensor({3}, {1, 2, 3}), 0, 0));
  EXPECT_FALSE(close_to(x, RefTensor({3}, {1, 2, 3.001}), 1e-6, 1e-5));
  EXPECT_FALSE(close_to(x, RefTensor({1, 3}, {1, 2, 3}), 1, 1));
  EXPECT_FALSE(close_to(tg::full({1}, NAN), RefTensor({1}, {1.0}), 1, 1));
  EXPECT_TRUE(close_to(x.t().unsqueeze(0).expand({2, 3}), RefTensor({2, 3}, {1, 2, 3, 1, 2, 3}), 0, 0));
}
}  // namespace

namespace {
// float32 +- float16 / bfloat16 (either side) runs as one mixed kernel that reads the half input as
// it is (has_mixed_form): exactly the float32 op on the widened input, with broadcasting, a
// transposed operand, alpha, on both devices. A half result (a 0-d float32 operand) still rounds
// that operand first: no narrowing form is taken in its place.
TEST(MixedAdd, Float32WithHalfOperandIsTheFloat32OpExactly) {
  std::vector<tg::Device> devs{tg::kCPU};
  if (tg::cuda::is_available()) devs.emplace_back(tg::kCUDA);
  for (tg::Device dev : devs)
    for (DType h : {tg::kBFloat16, tg::kFloat16}) {
      SCOPED_TRACE(dev.str() + " " + tg::dtype_name(h));
      const Tensor a = tg::randn({33, 17}, tg::TensorOptions().device(dev));
      const Tensor b = tg::randn({17, 33}, tg::TensorOptions().device(dev)).to(h).t();  // not contiguous
      const Tensor r = tg::randn({1, 17}, tg::TensorOptions().device(dev)).to(h);        // broadcast
      const Tensor bw = b.to(tg::kFloat32), rw = r.to(tg::kFloat32);
      auto same = [](const Tensor& got, const Tensor& want) {
        ASSERT_EQ(got.dtype(), tg::kFloat32);
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_EQ(got.cpu().contiguous().to_vector<float>(), want.cpu().contiguous().to_vector<float>());
      };
      same(a + b, a + bw);
      same(b + a, bw + a);
      same(a - r, a - rw);
      same(r - a, rw - a);
      same(tg::add(a, b, 0.5), tg::add(a, bw, 0.5));
      same(tg::sub(b, a, 3), tg::sub(bw, a, 3));
      // A 0-d float32 operand beside a dimmed half one: the result is half and the float32 value is
      // rounded to it first (promotion within floating types), as before the mixed forms existed.
      const Tensor third = tg::full({}, 1.0 / 3.0, tg::TensorOptions().device(dev));
      const Tensor den = (tg::arange(200) + 1).to(h).to(dev);  // 1 .. 200: some quotients round differently
      const Tensor q = tg::div(third, den), want = tg::div(third.to(h), den);
      ASSERT_EQ(q.dtype(), h);
      EXPECT_EQ(q.to(tg::kFloat32).cpu().to_vector<float>(), want.to(tg::kFloat32).cpu().to_vector<float>());
    }
}
}  // namespace
