// nn::Module: registration, PyTorch's traversal order, Sequential naming,
// to(), train/eval, zero_grad, state_dict round trip and load_state_dict errors.
#include <gtest/gtest.h>

#include <tapegrad/tapegrad.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using tg::Tensor;
namespace nn = tg::nn;

std::vector<std::string> names(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (const auto& [n, t] : v) out.push_back(n);
  return out;
}

std::vector<double> host(const Tensor& t) {
  return t.to(tg::Device(tg::kCPU), tg::kFloat64).contiguous().to_vector<double>();
}

// A user module in the style the API shows: children held as shared_ptr members.
struct Block : nn::Module {
  Block() {
    scale = register_parameter("scale", tg::ones({3}));
    fc = register_module("fc", std::make_shared<nn::Linear>(3, 2));
    running = register_buffer("running", tg::zeros({2}));
    head = register_module("head", std::make_shared<nn::Sequential>(nn::ReLU(), nn::Linear(2, 1, false)));
  }
  Tensor forward(const Tensor& x) override { return head->forward(fc->forward(x * scale)); }
  Tensor scale, running;
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::Sequential> head;
};

TEST(Module, NamedParametersInPyTorchOrder) {
  Block b;
  EXPECT_EQ(names(b.named_parameters()), (std::vector<std::string>{"scale", "fc.weight", "fc.bias", "head.1.weight"}));
  EXPECT_EQ(names(b.named_parameters(false)), (std::vector<std::string>{"scale"}));
  EXPECT_EQ(names(b.named_buffers()), (std::vector<std::string>{"running"}));
  EXPECT_EQ(b.children().size(), 2u);
  auto ps = b.parameters();
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_TRUE(ps[1].is_same(b.fc->weight));
  for (const auto& p : ps) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
  // state_dict: own params, own buffers, then children (as PyTorch's _save_to_state_dict).
  EXPECT_EQ(b.state_dict().keys(),
            (std::vector<std::string>{"scale", "running", "fc.weight", "fc.bias", "head.1.weight"}));
}

TEST(Module, SharedParametersListedOnce) {
  auto lin = std::make_shared<nn::Linear>(2, 2);
  nn::Sequential s(lin, lin);
  EXPECT_EQ(names(s.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias"}));
  EXPECT_EQ(s.state_dict().size(), 4u);  // state_dict keeps every name, as PyTorch
}

TEST(Module, RegistrationErrors) {
  nn::Linear l(2, 2);
  EXPECT_THROW(l.register_parameter("weight", tg::zeros({1})), tg::Error);
  EXPECT_THROW(l.register_parameter("a.b", tg::zeros({1})), tg::Error);
  EXPECT_THROW(l.register_parameter("", tg::zeros({1})), tg::Error);
  EXPECT_THROW(l.register_parameter("i", tg::zeros({1}, tg::kInt64)), tg::Error);  // ints cannot require grad
  EXPECT_NO_THROW(l.register_parameter("i", tg::zeros({1}, tg::kInt64), false));
  EXPECT_THROW(l.register_module("m", std::shared_ptr<nn::Module>()), tg::Error);
}

TEST(Sequential, NamingAndForward) {
  tg::manual_seed(1);
  nn::Sequential s(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 1));
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(names(s.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  s.push_back(nn::Tanh());
  s.push_back(std::make_shared<nn::Sigmoid>());
  EXPECT_EQ(s.named_children()[4].first, "4");
  EXPECT_EQ(s[3]->name(), "Tanh");
  auto x = tg::randn({5, 4});
  auto* l0 = dynamic_cast<nn::Linear*>(s[0].get());
  auto* l2 = dynamic_cast<nn::Linear*>(s[2].get());
  ASSERT_TRUE(l0 && l2);
  Tensor want =
      tg::sigmoid(tg::tanh(tg::matmul(tg::relu(tg::matmul(x, l0->weight.t()) + l0->bias), l2->weight.t()) + l2->bias));
  Tensor got = s(x);
  EXPECT_EQ(got.sizes(), (tg::Shape{5, 1}));
  auto g = host(got), w = host(want);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], w[i], 1e-6);
  // A module passed by value shares its parameters with the original.
  nn::Linear lin(3, 3);
  nn::Sequential s2(lin);
  EXPECT_TRUE(s2.parameters()[0].is_same(lin.weight));
  // Copy construction copies (shallowly), it does not nest.
  nn::Sequential s3(s);
  EXPECT_EQ(s3.size(), s.size());
}

TEST(Module, TrainEvalRecursive) {
  Block b;
  EXPECT_TRUE(b.is_training());
  b.eval();
  EXPECT_FALSE(b.is_training());
  EXPECT_FALSE(b.head->is_training());
  EXPECT_FALSE((*b.head)[1]->is_training());
  b.train();
  EXPECT_TRUE((*b.head)[0]->is_training());
}

TEST(Module, ZeroGradSetsUndefined) {
  nn::Linear l(3, 2);
  tg::nn::functional::mse_loss(l(tg::randn({4, 3})), tg::zeros({4, 2})).backward();
  ASSERT_TRUE(l.weight.grad().defined());
  l.zero_grad();
  EXPECT_FALSE(l.weight.grad().defined());
  EXPECT_FALSE(l.bias.grad().defined());
}

TEST(Module, ToDTypeKeepsHandles) {
  Block b;
  Tensor w = b.fc->weight;  // a handle taken before the move (as an optimizer's)
  std::vector<Tensor> params = b.parameters();
  auto before = host(w);
  tg::nn::functional::mse_loss(b(tg::randn({2, 3})), tg::zeros({2, 1})).backward();
  b.to(tg::kFloat64);
  EXPECT_EQ(w.dtype(), tg::kFloat64);
  EXPECT_EQ(params[0].dtype(), tg::kFloat64);
  EXPECT_EQ(b.running.dtype(), tg::kFloat64);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  EXPECT_EQ(w.grad().dtype(), tg::kFloat64);
  EXPECT_EQ(host(w), before);
  // Training still works after the move: grads arrive in the new dtype.
  b.zero_grad();
  tg::nn::functional::mse_loss(b(tg::randn({2, 3}, tg::kFloat64)), tg::zeros({2, 1}, tg::kFloat64)).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), tg::kFloat64);
  EXPECT_EQ(w.grad().sizes(), w.sizes());
  EXPECT_THROW(b.to(tg::kInt64), tg::Error);
}

TEST(Module, ToCudaKeepsHandles) {
  if (!tg::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  nn::Linear l(3, 2);
  Tensor w = l.weight;
  auto before = host(w);
  l.to(tg::kCUDA);
  EXPECT_TRUE(w.is_cuda());
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(host(w), before);
  tg::nn::functional::mse_loss(l(tg::randn({4, 3}, tg::kCUDA)), tg::zeros({4, 2}, tg::kCUDA)).backward();
  EXPECT_TRUE(w.grad().is_cuda());
  l.to(tg::kCPU);
  EXPECT_TRUE(w.is_cpu());
  EXPECT_TRUE(w.grad().is_cpu());
}

TEST(StateDict, RoundTrip) {
  tg::manual_seed(3);
  Block a;
  tg::manual_seed(4);
  Block b;
  ASSERT_NE(host(a.fc->weight), host(b.fc->weight));
  auto sd = a.state_dict();
  EXPECT_FALSE(sd["fc.weight"].requires_grad());  // detached
  auto res = b.load_state_dict(sd);
  EXPECT_TRUE(res.missing_keys.empty() && res.unexpected_keys.empty());
  for (const auto& [n, t] : a.state_dict()) EXPECT_EQ(host(t), host(b.state_dict()[n])) << n;
  EXPECT_TRUE(b.fc->weight.requires_grad());
  EXPECT_TRUE(b.fc->weight.is_leaf());
  // Values are copied, not aliased.
  {
    tg::NoGradGuard g;
    a.fc->weight.fill_(7.0);
  }
  EXPECT_NE(host(b.fc->weight)[0], 7.0);
  // Converting dtype on load.
  nn::StateDict sd64;
  for (const auto& [n, t] : a.state_dict()) sd64.insert(n, t.to(tg::kFloat64));
  b.load_state_dict(sd64);
  EXPECT_EQ(b.fc->weight.dtype(), tg::kFloat32);
  EXPECT_EQ(host(b.fc->weight)[0], 7.0);
}

TEST(StateDict, LoadErrorsListEverything) {
  nn::Linear l(3, 2);
  nn::StateDict sd{{"weight", tg::zeros({2, 4})}, {"extra", tg::zeros({1})}, {"more", tg::zeros({1})}};
  try {
    l.load_state_dict(sd);
    FAIL() << "expected tg::Error";
  } catch (const tg::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("missing keys (1): bias"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected keys (2): extra, more"), std::string::npos) << m;
    EXPECT_NE(m.find("weight: checkpoint [2, 4] vs model [2, 3]"), std::string::npos) << m;
  }
  // Non-strict: keys are reported, shapes still checked.
  EXPECT_THROW(l.load_state_dict(sd, false), tg::Error);
  nn::StateDict ok{{"weight", tg::ones({2, 3})}, {"extra", tg::zeros({1})}};
  auto res = l.load_state_dict(ok, false);
  EXPECT_EQ(res.missing_keys, std::vector<std::string>{"bias"});
  EXPECT_EQ(res.unexpected_keys, std::vector<std::string>{"extra"});
  EXPECT_EQ(host(l.weight), std::vector<double>(6, 1.0));
  // Nothing is copied when strict loading fails.
  nn::StateDict partial{{"weight", tg::zeros({2, 3})}};
  EXPECT_THROW(l.load_state_dict(partial), tg::Error);
  EXPECT_EQ(host(l.weight), std::vector<double>(6, 1.0));
}

TEST(StateDict, OrderedInsert) {
  nn::StateDict sd;
  sd.insert("b", tg::zeros({1}));
  sd.insert("a", tg::zeros({2}));
  sd.insert("b", tg::zeros({3}));
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(sd["b"].numel(), 3);
  EXPECT_THROW(sd.at("c"), tg::Error);
  // From other (name, Tensor) ranges, in their order.
  nn::Linear l(2, 2);
  nn::StateDict from_params = l.named_parameters();
  EXPECT_EQ(from_params.keys(), (std::vector<std::string>{"weight", "bias"}));
  nn::StateDict from_map = std::map<std::string, Tensor>{{"z", tg::zeros({1})}, {"a", tg::ones({1})}};
  EXPECT_EQ(from_map.keys(), (std::vector<std::string>{"a", "z"}));
  nn::StateDict copy = sd;
  EXPECT_EQ(copy.keys(), sd.keys());
}

}  // namespace
