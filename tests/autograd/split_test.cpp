// split / chunk / unbind: torch's piece sizes, views of the input, gradients (one node for all the
// pieces: the input's gradient is assembled once, zeros for pieces that got none), gradcheck and
// gradgradcheck on CPU and CUDA, contiguous and not, bfloat16, in-place on a piece, export, errors.
#include <functional>
#include <string>
#include <vector>

#include "tests/autograd/common.h"

namespace tg::testing {
namespace {

std::vector<int64_t> lens(const std::vector<Tensor>& ps, int64_t d) {
  std::vector<int64_t> out;
  for (const Tensor& p : ps) out.push_back(p.size(d));
  return out;
}

using V = std::vector<int64_t>;

TEST(Split, PieceSizesAsTorch) {
  const Tensor x = tg::arange(30).to(kFloat64).reshape({5, 6});
  EXPECT_EQ(lens(x.split(2), 0), (V{2, 2, 1}));
  EXPECT_EQ(lens(x.split(6, 1), 1), (V{6}));
  EXPECT_EQ(lens(x.split(7, 1), 1), (V{6}));
  EXPECT_EQ(lens(x.split({1, 0, 5}, -1), 1), (V{1, 0, 5}));
  EXPECT_EQ(lens(tg::split(x, std::vector<int64_t>{3, 2}, 0), 0), (V{3, 2}));
  EXPECT_EQ(lens(x.chunk(3, 0), 0), (V{2, 2, 1}));
  EXPECT_EQ(lens(x.chunk(4, 1), 1), (V{2, 2, 2})) << "torch.chunk gives fewer pieces when they run out";
  EXPECT_EQ(lens(tg::chunk(x, 10, 0), 0), (V{1, 1, 1, 1, 1}));
  const Tensor e = tg::zeros({0, 3});
  EXPECT_EQ(lens(e.split(0), 0), (V{0}));
  EXPECT_EQ(lens(e.chunk(3), 0), (V{0, 0, 0}));
  const auto u = tg::unbind(x, 1);
  ASSERT_EQ(u.size(), 6u);
  EXPECT_EQ(u[2].sizes(), Shape({5}));
}

TEST(Split, PiecesAreViewsWithTheRightValues) {
  const Tensor x = tg::arange(30).to(kFloat64).reshape({5, 6});
  const auto p = x.split(4, 1);  // [5, 4], [5, 2]
  EXPECT_EQ(p[1].data_ptr(), static_cast<const char*>(x.data_ptr()) + 4 * sizeof(double));
  EXPECT_EQ(host(p[1]), (std::vector<double>{4, 5, 10, 11, 16, 17, 22, 23, 28, 29}));
  const auto u = x.t().unbind(0);  // the columns of x
  EXPECT_EQ(host(u[3]), (std::vector<double>{3, 9, 15, 21, 27}));
  const auto c = x.chunk(2, 0);  // rows 0-2, 3-4
  EXPECT_EQ(host(c[1]), host(x.slice(0, 3, 5)));
}

class SplitDev : public ::testing::TestWithParam<Dev> {
 protected:
  Device dev() const { return to_device(GetParam()); }
};

TEST_P(SplitDev, GradientIsAssembledOnceWithZerosForUnusedPieces) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Tensor x = tg::randn({4, 7}, TensorOptions().dtype(kFloat64).device(dev())).requires_grad_();
  const auto p = x.split({2, 3, 2}, 1);
  const Tensor w0 = tg::randn({4, 2}, TensorOptions().dtype(kFloat64).device(dev()));
  const Tensor w2 = tg::randn({4, 2}, TensorOptions().dtype(kFloat64).device(dev()));
  ((p[0] * w0).sum() + (p[2] * w2).sum()).backward();  // the middle piece takes no part
  const auto g = host(x.grad()), a = host(w0), b = host(w2);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 7; ++c) {
      const double want = c < 2 ? a[static_cast<size_t>(r * 2 + c)] : c < 5 ? 0.0 : b[static_cast<size_t>(r * 2 + c - 5)];
      EXPECT_EQ(g[static_cast<size_t>(r * 7 + c)], want) << r << ", " << c;
    }
  EXPECT_TRUE(x.grad().is_contiguous());
}

TEST_P(SplitDev, Gradcheck) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const auto o = TensorOptions().dtype(kFloat64).device(dev());
  const Tensor x = tg::randn({6, 5}, o), w = tg::randn({5, 2}, o);
  auto weighted = [&](const std::vector<Tensor>& ps) {  // every piece counted with its own weight
    Tensor acc = tg::zeros({}, o);
    for (size_t i = 0; i < ps.size(); ++i) acc = acc + (ps[i] * ps[i]).sum() * static_cast<double>(i + 1);
    return acc;
  };
  const std::vector<std::function<Tensor(const std::vector<Tensor>&)>> fns = {
      [&](const std::vector<Tensor>& in) { return weighted(in[0].split(2, 0)); },
      [&](const std::vector<Tensor>& in) { return weighted(in[0].t().split({1, 3, 2}, 1)); },  // not contiguous
      [&](const std::vector<Tensor>& in) { return weighted(in[0].chunk(3, 1)); },
      [&](const std::vector<Tensor>& in) { return weighted(in[0].t().unbind(1)); },
      [&](const std::vector<Tensor>& in) {  // a piece used twice, one not at all
        const auto p = in[0].split(3, 0);
        return tg::matmul(p[1], w).sum() + (p[1] * p[1]).sum();
      },
  };
  for (size_t i = 0; i < fns.size(); ++i) {
    EXPECT_TRUE(autograd::gradcheck(fns[i], {x})) << "case " << i;
    EXPECT_TRUE(autograd::gradgradcheck(fns[i], {x})) << "case " << i;
  }
}

TEST_P(SplitDev, ReducedPrecisionGradientIsExact) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  for (DType dt : {kBFloat16, kFloat16}) {
    const Tensor x = tg::randn({3, 9}, TensorOptions().dtype(dt).device(dev())).requires_grad_();
    const auto p = x.chunk(3, 1);
    const Tensor w = tg::randn({3, 3}, TensorOptions().dtype(dt).device(dev()));
    ((p[0] * 2.0).sum() + (p[2] * w).sum()).backward();
    ASSERT_EQ(x.grad().dtype(), dt);
    const auto g = host(x.grad()), wv = host(w);
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 9; ++c) {
        const double want = c < 3 ? 2.0 : c < 6 ? 0.0 : wv[static_cast<size_t>(r * 3 + c - 6)];
        EXPECT_EQ(g[static_cast<size_t>(r * 9 + c)], want) << dt << " " << r << ", " << c;
      }
  }
}

TEST_P(SplitDev, InPlaceOnAPieceReachesTheBase) {
  TG_SKIP_WITHOUT_CUDA(GetParam());
  const Tensor x = tg::randn({4, 3}, TensorOptions().dtype(kFloat64).device(dev())).requires_grad_();
  Tensor y = x * 2.0;
  auto p = y.split(2, 0);
  p[0].mul_(3.0);
  (y.sum() + p[1].sum()).backward();
  const auto g = host(x.grad());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(g[static_cast<size_t>(i)], i < 6 ? 6.0 : 4.0) << i;
}

INSTANTIATE_TEST_SUITE_P(Devices, SplitDev, ::testing::Values(Dev::CPU, Dev::CUDA), dev_name);

// Gradients of the pieces that already lie side by side in one storage (here: slices of one
// tensor passed as grad_outputs) are joined as a view of it; anything else is copied by a cat.
TEST(Split, AdjacentPieceGradientsJoinWithoutACopy) {
  const Tensor x = tg::randn({4, 3}, kFloat64).requires_grad_();
  const auto p = x.split(2, 0);
  const Tensor g = tg::arange(12).to(kFloat64).reshape({4, 3});
  const auto side_by_side = autograd::grad({p[0], p[1]}, {x}, {g.slice(0, 0, 2), g.slice(0, 2, 4)}, true);
  EXPECT_EQ(host(side_by_side[0]), host(g));
  EXPECT_EQ(side_by_side[0].data_ptr(), g.data_ptr()) << "joined as a view";
  const auto swapped = autograd::grad({p[0], p[1]}, {x}, {g.slice(0, 2, 4), g.slice(0, 0, 2)}, true);
  EXPECT_EQ(host(swapped[0]), host(tg::cat({g.slice(0, 2, 4), g.slice(0, 0, 2)}, 0)));
  EXPECT_NE(swapped[0].data_ptr(), g.data_ptr());
  // .grad() never aliases a tensor the caller holds
  tg::autograd::backward({p[0], p[1]}, {g.slice(0, 0, 2), g.slice(0, 2, 4)});
  EXPECT_EQ(host(x.grad()), host(g));
  EXPECT_NE(x.grad().data_ptr(), g.data_ptr());
}

// The pieces are outputs 0..n-1 of one node: retain_grad, a hook and autograd::grad address each
// piece's own gradient.
TEST(Split, RetainGradHooksAndGradOfOnePiece) {
  const Tensor x = tg::randn({6, 2}, kFloat64).requires_grad_();
  const Tensor y = x * 3.0;
  auto p = y.split(2, 0);
  p[1].retain_grad();
  int hooked = 0;
  p[2].register_hook([&](const Tensor& g) {
    ++hooked;
    return g * 10.0;  // replaces the gradient flowing into piece 2
  });
  (p[0].sum() + (p[1] * 2.0).sum() + (p[2] * 4.0).sum()).backward(Tensor(), {.retain_graph = true});
  EXPECT_EQ(hooked, 1);
  EXPECT_EQ(host(p[1].grad()), std::vector<double>(4, 2.0));
  std::vector<double> want;
  for (double v : {1.0, 2.0, 40.0}) want.insert(want.end(), 4, 3.0 * v);
  EXPECT_EQ(host(x.grad()), want);
  const auto g1 = autograd::grad({(p[1] * p[1]).sum()}, {p[1]});
  expect_near_vec(host(g1[0]), host(p[1] * 2.0), 0, 1e-15, "d sum(p1^2) / d p1");
}

TEST(Split, ExportedProgramReplaysThePieces) {
  auto fn = [](const std::vector<Tensor>& in) {
    const auto p = in[0].split({2, 4}, 1);
    const auto u = in[0].unbind(0);
    return std::vector<Tensor>{p[1] * 2.0 + 1.0, u[1] - u[0]};
  };
  const Tensor x = tg::randn({3, 6});
  auto ep = tg::export_function(fn, {x});
  const Tensor x2 = tg::randn({3, 6});
  const auto want = fn({x2}), got = ep.run({x2});
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) expect_near_vec(host(got[i]), host(want[i]), 1e-6, 1e-6, "output");
}

TEST(Split, BadInputNamesTheOpAndShape) {
  const Tensor x = tg::zeros({5, 6});
  auto expect_error = [](const std::function<void()>& f, const std::string& op, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error: " << what;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(op), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  };
  expect_error([&] { x.split(0, 1); }, "split", "[5, 6]");
  expect_error([&] { x.split(-2, 1); }, "split", "[5, 6]");
  expect_error([&] { x.split({4}, 1); }, "split", "[5, 6]");  // a braced list is sizes, not split_size 4
  expect_error([&] { x.split({3, -1, 4}, 1); }, "split", "[5, 6]");
  expect_error([&] { x.split(2, 2); }, "split", "dim");
  expect_error([&] { x.chunk(0, 0); }, "chunk", "[5, 6]");
  expect_error([&] { tg::full({}, 1.0).unbind(); }, "unbind", "zero-dimensional");
}

}  // namespace
}  // namespace tg::testing
