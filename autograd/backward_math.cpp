// Backward math that can be differentiated again (autograd/function.h, namespace bw): each helper
// is the native op on the first-order path and the recorded tg:: op under create_graph; the fused
// elementwise backward kernels as differentiable ops with their second derivatives; linear maps
// (a slice's or select's backward) recorded with their adjoint.
#include <cmath>
#include <utility>
#include <vector>

#include <tapegrad/autograd/function.h>

namespace tg::autograd::bw {

using backend::ElemOp;

Tensor add(const Tensor& a, const Tensor& b) { return creating_graph() ? tg::add(a, b) : native::add(a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return creating_graph() ? tg::sub(a, b) : native::sub(a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return creating_graph() ? tg::mul(a, b) : native::mul(a, b); }
Tensor mul(const Tensor& a, Scalar s) { return creating_graph() ? tg::mul(a, s) : native::mul(a, s); }
Tensor div(const Tensor& a, const Tensor& b) { return creating_graph() ? tg::div(a, b) : native::div(a, b); }
Tensor neg(const Tensor& a) { return creating_graph() ? tg::neg(a) : native::unary(ElemOp::Neg, a); }
Tensor where(const Tensor& c, const Tensor& a, const Tensor& b) {
  return creating_graph() ? tg::where(c, a, b) : native::where(c, a, b);
}
Tensor unsqueeze(const Tensor& a, int64_t dim) { return creating_graph() ? a.unsqueeze(dim) : native::unsqueeze(a, dim); }
Tensor squeeze(const Tensor& a, int64_t dim) { return creating_graph() ? a.squeeze(dim) : native::squeeze(a, dim); }
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  return creating_graph() ? a.transpose(d0, d1) : native::transpose(a, d0, d1);
}
Tensor permute(const Tensor& a, const Shape& dims) { return creating_graph() ? a.permute(dims) : native::permute(a, dims); }
Tensor reshape(const Tensor& a, const Shape& shape) {
  return creating_graph() ? a.reshape(shape) : native::reshape(a, shape);
}
Tensor expand(const Tensor& a, const Shape& shape) { return creating_graph() ? a.expand(shape) : native::expand(a, shape); }
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return creating_graph() ? a.slice(dim, start, end, step) : native::slice(a, dim, start, end, step);
}
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return creating_graph() ? tg::sum(a, DimList(dims), keepdim)
                          : native::reduce(backend::ReduceOp::Sum, a, DimList(dims), keepdim);
}
Tensor to(const Tensor& a, Device device, DType dtype) {
  return creating_graph() ? a.to(device, dtype) : native::to(a, device, dtype);
}

namespace {
// d bwd(g, s) / ds, divided by g where the kernel is g times a function of s; written with tg:: ops
// (recorded under create_graph, so every order works). Undefined: zero almost everywhere.
Tensor second_derivative(const char* op, ElemOp bwd, const Tensor& g, const Tensor& s, double p0, double p1) {
  switch (bwd) {
    case ElemOp::ReluBackward:
    case ElemOp::AbsBackward:
    case ElemOp::ClampBackward:
    case ElemOp::LeakyReluBackward:
      return Tensor();
    case ElemOp::Mul:  // g y (exp_'s backward, y its result) -> g
      return g;
    case ElemOp::SigmoidBackward:  // g y (1 - y) -> g (1 - 2 y)
      return tg::mul(g, tg::rsub(tg::mul(s, 2.0), 1.0));
    case ElemOp::TanhBackward:  // g (1 - y^2) -> -2 g y
      return tg::mul(g, tg::mul(s, -2.0));
    case ElemOp::SqrtBackward:  // g / (2 y) -> -g / (2 y^2)
      return tg::div(tg::mul(g, -0.5), tg::mul(s, s));
    case ElemOp::RsqrtBackward:  // -0.5 g y^3 -> -1.5 g y^2
      return tg::mul(g, tg::mul(tg::mul(s, s), -1.5));
    case ElemOp::PowScalarBackward:  // g p x^(p-1) -> g p (p-1) x^(p-2)
      if (p0 == 0 || p0 == 1) return Tensor();
      if (p0 == 2) return tg::mul(g, 2.0);
      return tg::mul(g, tg::mul(tg::pow(s, p0 - 2), p0 * (p0 - 1)));
    case ElemOp::GeluBackward: {  // g (Phi(x) + x phi(x)) -> g phi(x) (2 - x^2)
      const double inv_sqrt_2pi = 0.3989422804014327;
      Tensor phi = tg::mul(tg::exp(tg::mul(tg::mul(s, s), -0.5)), inv_sqrt_2pi);
      return tg::mul(g, tg::mul(phi, tg::rsub(tg::mul(s, s), 2.0)));
    }
    case ElemOp::GeluTanhBackward: {  // gelu_tanh'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2),
      // t = tanh(u), u = k (x + c x^3), u' = k (1 + 3 c x^2), u'' = 6 k c x
      const double k = 0.7978845608028654, c = 0.044715;
      Tensor x2 = tg::mul(s, s);
      Tensor t = tg::tanh(tg::mul(tg::add(s, tg::mul(tg::mul(x2, s), c)), k));
      Tensor du = tg::mul(tg::add(tg::mul(x2, 3 * c), 1.0), k);
      Tensor inner = tg::sub(tg::mul(s, 6 * k * c), tg::mul(tg::mul(t, tg::mul(du, du)), 2.0));
      Tensor d = tg::mul(tg::rsub(tg::mul(t, t), 1.0), tg::add(du, tg::mul(tg::mul(s, inner), 0.5)));
      return tg::mul(g, d);
    }
    case ElemOp::SiluBackward: {  // g sig (1 + x (1 - sig)) -> g sig (1 - sig) (2 + x (1 - 2 sig))
      Tensor sg = tg::sigmoid(s);
      Tensor d1 = tg::mul(sg, tg::rsub(sg, 1.0));
      return tg::mul(g, tg::mul(d1, tg::add(tg::mul(s, tg::rsub(tg::mul(sg, 2.0), 1.0)), 2.0)));
    }
    case ElemOp::EluBackward: {  // x > 0 ? g : g a e^x -> x > 0 ? 0 : g a e^x
      Tensor neg_part = tg::mul(g, tg::mul(tg::exp(s), p0));
      return tg::where(s.gt(Scalar(0.0)), tg::mul(neg_part, 0.0), neg_part);
    }
    case ElemOp::SoftplusBackward: {  // g sig(b x), g where b x > t -> g b sig (1 - sig), 0 where b x > t
      Tensor bx = tg::mul(s, p0);
      Tensor sg = tg::sigmoid(bx);
      Tensor d = tg::mul(g, tg::mul(tg::mul(sg, tg::rsub(sg, 1.0)), p0));
      return tg::where(bx.gt(Scalar(p1)), tg::mul(d, 0.0), d);
    }
    default:
      TG_CHECK(false, op, ": double backward not implemented (the second derivative of its backward kernel)");
  }
  return Tensor();
}

}  // namespace

Tensor elementwise_backward(const char* name, ElemOp bwd, const Tensor& g, const Tensor& saved, double p0, double p1) {
  Tensor out = native::binary(bwd, g, saved, p0, p1);
  if (!should_record(g, saved)) return out;
  SavedTensor sg(g, name), ss(saved, name);
  return record(
      name, {g, saved}, std::move(out),
      [name, bwd, p0, p1, sg, ss](const Tensor& gg, const FunctionNode& n) -> std::vector<Tensor> {
        Tensor s = ss.unpack();
        Tensor dg, ds;
        if (n.needs_input_grad(0)) dg = elementwise_backward(name, bwd, gg, s, p0, p1);  // linear in g
        if (n.needs_input_grad(1)) {
          Tensor d = second_derivative(name, bwd, sg.unpack(), s, p0, p1);
          if (d.defined()) ds = tg::mul(gg, d);
        }
        return {dg, ds};
      },
      kDifferentiable);
}

Tensor linear_map(const char* name, const Tensor& g, const std::function<Tensor(const Tensor&)>& f,
                  std::function<Tensor(const Tensor&)> adjoint) {
  Tensor out = f(g);  // native ops: nothing recorded
  if (!should_record(g)) return out;
  return record(
      name, {g}, std::move(out),
      [adjoint = std::move(adjoint)](const Tensor& gg, const FunctionNode&) -> std::vector<Tensor> {
        return {adjoint(gg)};
      },
      kDifferentiable);
}

}  // namespace tg::autograd::bw
