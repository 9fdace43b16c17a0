// Tensor: shared storage plus sizes, strides, offset, dtype and device. Views
// share storage and change only metadata. Methods here forward to the op
// front-ends declared in core/ops.h.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <string_view>
#include <tuple>
#include <vector>

#include <tapegrad/core/device.h>
#include <tapegrad/core/dtype.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/hooks.h>
#include <tapegrad/core/shape.h>
#include <tapegrad/core/storage.h>
#include <tapegrad/core/tensor_options.h>

namespace tg {

class Tensor;
namespace autograd {
struct AutogradMeta;
class Node;
}  // namespace autograd
namespace detail {
struct FiniteProxy;
}  // namespace detail

class TensorImpl {
 public:
  TensorImpl(std::shared_ptr<Storage> storage, Shape sizes, Shape strides, int64_t offset, DType dtype);
  std::shared_ptr<Storage> storage;
  Shape sizes;
  Shape strides;        // in elements
  int64_t offset = 0;   // in elements
  DType dtype;
  Device device;
  int64_t numel = 0;
  bool contiguous = true;
  std::shared_ptr<autograd::AutogradMeta> autograd;  // null until autograd touches the tensor
  // Smaller tensors that are all finite exactly when this one is (core/finite_proxy.h); null
  // unless the op that made it said so.
  std::shared_ptr<detail::FiniteProxy> finite_proxy;
  // Set by the public view methods (slice, select, view, transpose, ...) when the result shares
  // the input's storage: the tensor first viewed (never itself a view), the storage version at
  // which this view's autograd history was last made current, and whether grad mode was off when
  // the view was made. Autograd records in-place ops on views through them (autograd/node.cpp).
  std::shared_ptr<TensorImpl> view_base;
  uint32_t view_version = 0;
  bool view_no_grad = false;
  void refresh();  // recompute numel and contiguity after sizes/strides change
};

struct BackwardOptions {
  std::optional<bool> retain_graph;  // default: create_graph, as PyTorch
  bool create_graph = false;         // record the backward, so .grad() can be differentiated again
};

// A strided view of CPU memory for hand-written loops (the C++ answer to numba's @njit).
template <typename T, int N>
class TensorAccessor {
 public:
  TensorAccessor(T* data, const int64_t* sizes, const int64_t* strides) : data_(data), sizes_(sizes), strides_(strides) {}
  TensorAccessor<T, N - 1> operator[](int64_t i) const {
    return TensorAccessor<T, N - 1>(data_ + i * strides_[0], sizes_ + 1, strides_ + 1);
  }
  int64_t size(int d) const { return sizes_[d]; }
  int64_t stride(int d) const { return strides_[d]; }
  T* data() const { return data_; }

 private:
  T* data_;
  const int64_t* sizes_;
  const int64_t* strides_;
};
template <typename T>
class TensorAccessor<T, 1> {
 public:
  TensorAccessor(T* data, const int64_t* sizes, const int64_t* strides) : data_(data), sizes_(sizes), strides_(strides) {}
  T& operator[](int64_t i) const { return data_[i * strides_[0]]; }
  int64_t size(int d) const { return sizes_[d]; }
  int64_t stride(int d) const { return strides_[d]; }
  T* data() const { return data_; }

 private:
  T* data_;
  const int64_t* sizes_;
  const int64_t* strides_;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- facts
  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const { return impl().sizes; }
  const Shape& strides() const { return impl().strides; }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().sizes.size()); }
  int64_t numel() const { return impl().numel; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().device; }
  bool is_cuda() const { return impl().device.is_cuda(); }
  bool is_cpu() const { return impl().device.is_cpu(); }
  bool is_contiguous() const { return impl().contiguous; }
  // Dense in that format (size-1 dims' strides ignored); ChannelsLast needs 4 dims.
  bool is_contiguous(MemoryFormat format) const;
  int64_t storage_offset() const { return impl().offset; }
  size_t element_size() const { return tg::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  TensorOptions options() const { return TensorOptions().dtype(dtype()).device(device()); }
  uint32_t version() const { return impl().storage->version(); }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // ---- raw data
  void* data_ptr() const;
  template <typename T>
  T* data_ptr() const {
    TG_CHECK(dtype_of<T> == dtype(), "data_ptr<", dtype_name(dtype_of<T>), ">: tensor has dtype ", dtype_name(dtype()));
    return static_cast<T*>(data_ptr());
  }
  template <typename T, int N>
  TensorAccessor<T, N> accessor() const {
    TG_CHECK(is_cpu(), "accessor: tensor is on ", device(), "; accessor is for CPU tensors");
    TG_CHECK(dim() == N, "accessor<", N, ">: tensor has ", dim(), " dims ", sizes());
    return TensorAccessor<T, N>(data_ptr<T>(), sizes().data(), strides().data());
  }
  Scalar item() const;
  template <typename T>
  T item() const {
    Scalar s = item();
    if constexpr (std::is_same_v<T, bool>) return s.to_double() != 0;
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(s.to_int());  // saturated for doubles
    else return static_cast<T>(s.to_double());
  }
  // Host copy of the elements in row-major order; T must match dtype().
  template <typename T>
  std::vector<T> to_vector() const {
    TG_CHECK(dtype_of<T> == dtype(), "to_vector<", dtype_name(dtype_of<T>), ">: tensor has dtype ", dtype_name(dtype()));
    std::vector<T> out(static_cast<size_t>(numel()));
    copy_to_host(out.data());
    return out;
  }
  void copy_to_host(void* dst) const;  // numel()*element_size() bytes, row-major

  // ---- moves and copies
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor to(DeviceType device, bool non_blocking = false) const { return to(Device(device), non_blocking); }
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;
  Tensor cpu() const { return to(Device(kCPU)); }
  Tensor cuda() const { return to(Device(kCUDA)); }
  Tensor contiguous() const;
  // A copy in `format` unless already in it (differentiable); ChannelsLast needs 4 dims.
  Tensor contiguous(MemoryFormat format) const;
  Tensor clone() const;
  Tensor detach() const;

  // ---- views
  Tensor view(Shape shape) const;
  Tensor reshape(Shape shape) const;
  // Dims start_dim..end_dim (negative: from the end) merged into one, as torch.flatten (a reshape;
  // a 0-d tensor gives [1]).
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor t() const;
  Tensor permute(Shape dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const { return slice(dim, start, start + length); }
  Tensor select(int64_t dim, int64_t index) const;
  // Views of consecutive pieces along dim, as torch.split / chunk / unbind: pieces of split_size
  // (the last one smaller), of the given sizes (they must add up to size(dim)), `chunks` pieces of
  // ceil(size(dim) / chunks) (fewer when they run out), or one per index with dim removed. Their
  // backward assembles the input's gradient once (zeros for pieces that got none).
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> split(const std::vector<int64_t>& split_sizes, int64_t dim = 0) const;
  std::vector<Tensor> split(std::initializer_list<int64_t> split_sizes, int64_t dim = 0) const {
    return split(std::vector<int64_t>(split_sizes), dim);
  }
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  std::vector<Tensor> unbind(int64_t dim = 0) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(Shape sizes) const;
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor index_select(int64_t dim, const Tensor& index) const;

  // ---- elementwise
  Tensor neg() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor abs() const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor gelu() const;
  Tensor pow(Scalar exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor clamp(Scalar lo, Scalar hi) const;
  Tensor eq(const Tensor& o) const;
  Tensor ne(const Tensor& o) const;
  Tensor lt(const Tensor& o) const;
  Tensor le(const Tensor& o) const;
  Tensor gt(const Tensor& o) const;
  Tensor ge(const Tensor& o) const;
  Tensor eq(Scalar o) const;
  Tensor ne(Scalar o) const;
  Tensor lt(Scalar o) const;
  Tensor le(Scalar o) const;
  Tensor gt(Scalar o) const;
  Tensor ge(Scalar o) const;

  // ---- in place (bump the version counter)
  const Tensor& add_(const Tensor& o, Scalar alpha = 1) const;
  const Tensor& add_(Scalar o) const;
  const Tensor& sub_(const Tensor& o, Scalar alpha = 1) const;
  const Tensor& sub_(Scalar o) const;
  const Tensor& mul_(const Tensor& o) const;
  const Tensor& mul_(Scalar o) const;
  const Tensor& div_(const Tensor& o) const;
  const Tensor& div_(Scalar o) const;
  const Tensor& zero_() const;
  const Tensor& fill_(Scalar v) const;
  // Random fills from the device's Philox generator (floating dtypes): the same numbers that
  // rand / randn of this shape would give after the same manual_seed.
  const Tensor& uniform_(double from = 0.0, double to = 1.0) const;
  const Tensor& normal_(double mean = 0.0, double std = 1.0) const;
  const Tensor& copy_(const Tensor& src, bool non_blocking = false) const;
  // In a graph (grad mode on, self or an operand requires grad) each in-place op is recorded as
  // PyTorch does: self's history (a view's: its base's) goes through the op's backward
  // (autograd/functions/inplace.cpp). A leaf that requires grad, or a view of one, is refused.
  const Tensor& relu_() const;
  const Tensor& sigmoid_() const;
  const Tensor& tanh_() const;
  const Tensor& exp_() const;
  const Tensor& clamp_(Scalar lo, Scalar hi) const;
  const Tensor& clamp_min_(Scalar lo) const;
  const Tensor& clamp_max_(Scalar hi) const;
  const Tensor& masked_fill_(const Tensor& mask, Scalar value) const;
  const Tensor& index_add_(int64_t dim, const Tensor& index, const Tensor& source, Scalar alpha = 1) const;

  // ---- reductions (dims: one int or a list; empty = all)
  Tensor sum() const;
  Tensor sum(DimList dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(DimList dims, bool keepdim = false) const;
  Tensor var() const;
  Tensor var(DimList dims, bool keepdim = false, int64_t correction = 1) const;
  Tensor std() const;
  Tensor std(DimList dims, bool keepdim = false, int64_t correction = 1) const;
  Tensor max() const;
  Tensor max(DimList dims, bool keepdim = false) const;  // values, like torch.amax
  Tensor min() const;
  Tensor min(DimList dims, bool keepdim = false) const;
  Tensor argmax() const;  // index into the flattened tensor
  Tensor argmax(int64_t dim, bool keepdim = false) const;

  Tensor matmul(const Tensor& other) const;
  // ---- issue 15: softmax family
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor logsumexp(DimList dims, bool keepdim = false) const;


  // ---- issue 15: general ops (the free functions of core/ops.h)
  Tensor sin() const;
  Tensor cos() const;
  Tensor rsqrt() const;
  Tensor gelu(std::string_view approximate) const;
  Tensor masked_fill(const Tensor& mask, Scalar value) const;
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor scatter(int64_t dim, const Tensor& index, const Tensor& src) const;
  Tensor scatter(int64_t dim, const Tensor& index, Scalar value) const;
  Tensor scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const;
  Tensor index_add(int64_t dim, const Tensor& index, const Tensor& source, Scalar alpha = 1) const;
  Tensor cumsum(int64_t dim) const;
  std::tuple<Tensor, Tensor> sort(int64_t dim = -1, bool descending = false) const;
  Tensor argsort(int64_t dim = -1, bool descending = false) const;
  std::tuple<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true) const;

  // ---- autograd (autograd/)
  const Tensor& requires_grad_(bool requires_grad = true) const;
  bool requires_grad() const;
  bool is_leaf() const;
  Tensor grad() const;
  Tensor& mutable_grad() const;  // the leaf's .grad slot; assign an undefined tensor to clear it
  void retain_grad() const;
  void backward(const Tensor& gradient = Tensor(), BackwardOptions options = {}) const;
  std::shared_ptr<autograd::Node> grad_fn() const;
  // ---- autograd hooks (autograd/hooks.cpp)
  // fn(grad) runs on the gradient flowing into this tensor (leaf or not), before it reaches
  // .grad() or the op that made the tensor, and before autograd::grad returns it. It returns
  // void (keep), a Tensor or a std::optional<Tensor> (undefined / empty: keep); several hooks
  // run in registration order, each seeing the previous one's result.
  template <typename F>
  RemovableHandle register_hook(F&& fn) const {
    return add_grad_hook(detail::ReplacingHook<Tensor(const Tensor&)>::wrap(std::forward<F>(fn)));
  }
  // fn(param) runs once per backward, after this leaf's .grad() was accumulated.
  RemovableHandle register_post_accumulate_grad_hook(std::function<void(Tensor&)> fn) const;

  TensorImpl& impl() const {
    TG_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  RemovableHandle add_grad_hook(std::function<Tensor(const Tensor&)> fn) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

}  // namespace tg
