// tg::StateDict (core/state_dict.h): insertion order, replacement in place, erase, lookups,
// and that tg::nn::StateDict is the same type.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <tapegrad/tapegrad.h>

namespace tg::testing {
namespace {

static_assert(std::is_same_v<nn::StateDict, StateDict>);

TEST(StateDict, OrderReplaceErase) {
  StateDict sd{{"b", tg::ones({1})}, {"a", tg::zeros({2})}, {"c", tg::full({3}, 2.0)}};
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"b", "a", "c"}));
  sd.insert("a", tg::ones({4}));  // replaced where it stands
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(sd.at("a").numel(), 4);
  EXPECT_TRUE(sd.erase("b"));
  EXPECT_FALSE(sd.erase("b"));
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"a", "c"}));
  // Lookups still find the entries that moved.
  EXPECT_EQ(sd.at("c").to_vector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_EQ(sd["a"].numel(), 4);
  EXPECT_EQ(sd.find("b"), nullptr);
  EXPECT_FALSE(sd.contains("b"));
  sd.insert("b", tg::ones({5}));  // back, at the end
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"a", "c", "b"}));
  EXPECT_EQ(sd.at("b").numel(), 5);
  EXPECT_EQ(sd.size(), 3u);
  EXPECT_THROW((void)sd.at("zz"), Error);
}

TEST(StateDict, FromAnyRangeOfPairs) {
  std::map<std::string, Tensor> m{{"y", tg::ones({1})}, {"x", tg::ones({2})}};
  StateDict sd = m;  // a std::map's order
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"x", "y"}));
  std::vector<std::pair<std::string, Tensor>> v{{"q", tg::ones({1})}, {"p", tg::ones({1})}};
  StateDict sv = v;
  EXPECT_EQ(sv.keys(), (std::vector<std::string>{"q", "p"}));
  EXPECT_TRUE(StateDict().empty());
}

}  // namespace
}  // namespace tg::testing
