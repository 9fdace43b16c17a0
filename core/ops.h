// The public ops: factories and every op the Tensor methods forward to. Each is
// a front-end (autograd/functions/*.cpp) that records the autograd node around
// the backend-independent native op (core/native.h).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include <tapegrad/core/tensor.h>

namespace tg {

// ---- factories
Tensor empty(Shape sizes, TensorOptions options = {});
Tensor zeros(Shape sizes, TensorOptions options = {});
Tensor ones(Shape sizes, TensorOptions options = {});
Tensor full(Shape sizes, Scalar value, TensorOptions options = {});
Tensor rand(Shape sizes, TensorOptions options = {});   // U[0, 1)
Tensor randn(Shape sizes, TensorOptions options = {});  // N(0, 1)
Tensor arange(int64_t end, TensorOptions options = kInt64);
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions options = {});
Tensor randperm(int64_t n, TensorOptions options = kInt64);
Tensor empty_like(const Tensor& t, TensorOptions options);
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, Scalar value);
Tensor rand_like(const Tensor& t);
Tensor randn_like(const Tensor& t);
void manual_seed(uint64_t seed);

// Copies host values into a new tensor (dtype from T unless options says otherwise).
Tensor tensor_from_host(const void* data, DType src_dtype, Shape sizes, TensorOptions options);
template <typename T>
Tensor tensor(const std::vector<T>& values, Shape sizes, TensorOptions options = {}) {
  TG_CHECK(static_cast<int64_t>(values.size()) == sizes.numel(), "tensor: ", values.size(), " values do not fill shape ",
           sizes);
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return tensor_from_host(bytes.data(), kBool, std::move(sizes), options);
  } else {
    return tensor_from_host(values.data(), dtype_of<T>, std::move(sizes), options);
  }
}
template <typename T>
Tensor tensor(const std::vector<T>& values, TensorOptions options = {}) {
  return tensor(values, Shape{static_cast<int64_t>(values.size())}, options);
}
// Wraps memory the caller owns; no copy. The memory must outlive the tensor.
Tensor from_blob(void* data, Shape sizes, TensorOptions options = {});
// Same, with explicit strides (elements) and a deleter called once when the last view dies.
Tensor from_blob(void* data, Shape sizes, Shape strides, DataPtr::Deleter deleter, void* deleter_ctx,
                 TensorOptions options = {});

// ---- elementwise (broadcasting, PyTorch type promotion)
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor rsub(const Tensor& a, Scalar b);  // b - a
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
Tensor rdiv(const Tensor& a, Scalar b);  // b / a
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor gelu(const Tensor& a);  // exact (erf) form, as torch's default
Tensor pow(const Tensor& a, Scalar exponent);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor clamp(const Tensor& a, Scalar lo, Scalar hi);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

// ---- reductions
Tensor sum(const Tensor& a, DimList dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, DimList dims = {}, bool keepdim = false);
Tensor var(const Tensor& a, DimList dims = {}, bool keepdim = false, int64_t correction = 1);
Tensor std(const Tensor& a, DimList dims = {}, bool keepdim = false, int64_t correction = 1);
Tensor amax(const Tensor& a, DimList dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, DimList dims = {}, bool keepdim = false);
Tensor argmax(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);

// ---- linear algebra
Tensor matmul(const Tensor& a, const Tensor& b);
// x (..., in) @ weight[out, in]^T + bias[out] (bias may be undefined), as torch.nn.functional.linear.
// On CUDA one cuBLASLt call with the bias fused; its backward fuses the bias gradient where it can.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// TF32 for float32 matmuls on CUDA (default false, as PyTorch).
void set_allow_tf32(bool allow);
bool allow_tf32();

// ---- views and copies (free-function spellings of the Tensor methods)
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, Shape dims);
Tensor reshape(const Tensor& a, Shape shape);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// torch.split / chunk / unbind (see Tensor::split): views of consecutive pieces along dim.
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& split_sizes, int64_t dim = 0);
inline std::vector<Tensor> split(const Tensor& a, std::initializer_list<int64_t> split_sizes, int64_t dim = 0) {
  return a.split(split_sizes, dim);
}
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);
std::vector<Tensor> unbind(const Tensor& a, int64_t dim = 0);
// ---- issue 17: torch.flatten
Tensor flatten(const Tensor& a, int64_t start_dim = 0, int64_t end_dim = -1);

// ---- issue 15: general ops (positional encodings, activations, indexing, sorting)
// Unary math; integer inputs compute in float32, as PyTorch.
Tensor sin(const Tensor& a);
Tensor cos(const Tensor& a);
Tensor rsqrt(const Tensor& a);  // 1 / sqrt(a)
// Activations (floating inputs only), as torch.nn.functional.
Tensor silu(const Tensor& a);                                // a * sigmoid(a)
Tensor gelu(const Tensor& a, std::string_view approximate);  // "none" (exact, erf) or "tanh"
Tensor softplus(const Tensor& a, Scalar beta = 1, Scalar threshold = 20);  // a where beta * a > threshold
Tensor leaky_relu(const Tensor& a, Scalar negative_slope = 0.01);
Tensor elu(const Tensor& a, Scalar alpha = 1);
// a with `value` where the bool `mask` (broadcast to a's shape) is true.
Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value);
// The lower / upper triangle of the last two dims (the rest zeroed); diagonal > 0 moves it up.
Tensor tril(const Tensor& a, int64_t diagonal = 0);
Tensor triu(const Tensor& a, int64_t diagonal = 0);
// int64 [..., num_classes] with a 1 at each index; num_classes = -1 takes max(index) + 1.
Tensor one_hot(const Tensor& index, int64_t num_classes = -1);
// Joins tensors of one shape along a new dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// out[i][j][k] = a[index[i][j][k]][j][k] along dim (dim 0 shown); index int64, same rank as a.
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
// A copy of a with out[index[i][j]][j] = src[i][j] along dim (dim 0 shown); repeated indices: one
// of the writes wins (unspecified which, as PyTorch).
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor scatter(const Tensor& a, int64_t dim, const Tensor& index, Scalar value);
// A copy of a with src added at index along dim; repeated indices add up.
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
// A copy of a with alpha * source[..., i, ...] added at a[..., index[i], ...] along dim (index 1-D).
Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& source, Scalar alpha = 1);
// Inclusive prefix sum along dim (integers and bool accumulate in int64, as PyTorch).
Tensor cumsum(const Tensor& a, int64_t dim);
// Sorted values and their int64 indices along dim; stable (ties keep their order).
std::tuple<Tensor, Tensor> sort(const Tensor& a, int64_t dim = -1, bool descending = false);
Tensor argsort(const Tensor& a, int64_t dim = -1, bool descending = false);
// The k largest (smallest) values along dim and their int64 indices, sorted when `sorted`.
std::tuple<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim = -1, bool largest = true,
                                bool sorted = true);

// ---- operators
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
inline Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(Scalar a, const Tensor& b) { return rsub(b, a); }
inline Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(Scalar a, const Tensor& b) { return rdiv(b, a); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
inline Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
inline Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
inline Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
inline Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
inline Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
inline Tensor operator==(const Tensor& a, Scalar b) { return a.eq(b); }
inline Tensor operator!=(const Tensor& a, Scalar b) { return a.ne(b); }
inline Tensor operator<(const Tensor& a, Scalar b) { return a.lt(b); }
inline Tensor operator<=(const Tensor& a, Scalar b) { return a.le(b); }
inline Tensor operator>(const Tensor& a, Scalar b) { return a.gt(b); }
inline Tensor operator>=(const Tensor& a, Scalar b) { return a.ge(b); }

// ---- issue 15: softmax family
// softmax / log_softmax over `dim` of a floating tensor, numerically stable (the row max is
// subtracted); float16 / bfloat16 accumulate in float. One fused pass on CUDA.
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// log(sum(exp(a), dims)) computed as max + log(sum(exp(a - max))); integers compute in float32.
Tensor logsumexp(const Tensor& a, DimList dims, bool keepdim = false);

// ---- runtime
const char* version();
// Runs fn(lo, hi) over [begin, end) split into chunks of at least `grain`, on the CPU backend's threads.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
int get_num_threads();
void set_num_threads(int n);

// ---- issue 15: normalization, embedding, dropout
// Whether ops must use deterministic algorithms (PyTorch's torch.use_deterministic_algorithms).
// tapegrad's default is true (PyTorch's is false): embedding's CUDA backward sums in a fixed order
// (sorted indices). false lets it add with atomics (faster, run-to-run differences in the last bits).
void use_deterministic_algorithms(bool on);
bool are_deterministic_algorithms_enabled();

}  // namespace tg
