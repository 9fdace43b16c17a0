// A whole training state in one safetensors file: the model, the optimizer, the
// GradScaler, a scheduler, the random generators (core/rng.h) and plain values
// such as the step, each entry prefixed with its part's name ("model.0.weight",
// "optimizer.state.0.exp_avg", "scaler.scale", "rng.cpu", "step"). Written
// atomically by tg::save, so a failed or interrupted save leaves the old file.
//
//   tg::save_checkpoint("ck.safetensors", {{"model", model}, {"optimizer", opt}, {"scaler", scaler},
//                                          {"rng", tg::rng_state_dict()}, {"step", step}});
//   tg::Checkpoint ck = tg::load_checkpoint("ck.safetensors");
//   ck.load_into("model", model);                 // model.load_state_dict(ck.at("model"))
//   ck.load_into("optimizer", opt);
//   tg::load_rng_state_dict(ck.at("rng"));
//   int64_t step = ck.item<int64_t>("step");
#pragma once
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <tapegrad/core/device.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/core/state_dict.h>
#include <tapegrad/core/tensor.h>

namespace tg {

// What a checkpoint part can be made of and loaded into: a Module, an optimizer, a
// GradScaler, a scheduler, or any class of the user's with these methods.
template <class T>
concept HasStateDict = requires(const T& t) {
  { t.state_dict() } -> std::convertible_to<StateDict>;
};
template <class T>
concept LoadsStateDict = requires(T& t, const StateDict& sd) {
  t.load_state_dict(sd);
};

// One named entry of save_checkpoint: a part (a StateDict, or the state_dict() of
// an object, taken when the entry is made) or a value (a number, stored as a 0-d
// int64 / float64 / bool tensor, or a tensor). Names are non-empty and made of
// letters, digits, '_' and '-'.
class CheckpointEntry {
 public:
  CheckpointEntry(std::string name, StateDict part) : name_(std::move(name)), part_(std::move(part)), is_part_(true) {}
  template <HasStateDict T>
  requires(!std::same_as<std::remove_cvref_t<T>, StateDict>) CheckpointEntry(std::string name, const T& object)
      : CheckpointEntry(std::move(name), StateDict(object.state_dict())) {}
  CheckpointEntry(std::string name, Tensor value) : name_(std::move(name)), value_(std::move(value)) {}
  template <class N>
  requires std::is_arithmetic_v<N> CheckpointEntry(std::string name, N value)
      : CheckpointEntry(std::move(name), number(value)) {}

  const std::string& name() const { return name_; }
  bool is_part() const { return is_part_; }
  const StateDict& part() const { return part_; }
  const Tensor& value() const { return value_; }

 private:
  template <class N>
  static Tensor number(N v) {
    if constexpr (std::is_same_v<N, bool>)
      return tg::full({}, v, kBool);
    else if constexpr (std::is_integral_v<N>) {
      if constexpr (std::is_unsigned_v<N>)
        TG_CHECK(v <= static_cast<unsigned long long>(INT64_MAX), "save_checkpoint: value ", v,
                 " does not fit the int64 it is stored as");
      return tg::full({}, static_cast<long long>(v), kInt64);
    } else
      return tg::full({}, static_cast<double>(v), kFloat64);
  }
  std::string name_;
  StateDict part_;
  Tensor value_;
  bool is_part_ = false;
};

// Writes every entry to one safetensors file: a part's entries as "<name>.<key>",
// a value as "<name>", in the order given; the "__metadata__" lists the parts and
// values (so an empty part, e.g. a disabled GradScaler's, loads back as empty).
// Everything is checked before the file is touched; tg::Error on a bad or repeated
// name, an undefined tensor, or a failed write (the old file is then intact).
void save_checkpoint(const std::string& path, const std::vector<CheckpointEntry>& entries);

// What load_checkpoint read: parts and values by name.
class Checkpoint {
 public:
  bool contains(std::string_view name) const;  // a part or a value
  // The part saved as `name`; tg::Error naming the parts there are when absent.
  const StateDict& at(std::string_view name) const;
  const StateDict& operator[](std::string_view name) const { return at(name); }
  // The value saved as `name` (tg::Error when absent), and its one element.
  const Tensor& value(std::string_view name) const;
  template <class T>
  T item(std::string_view name) const {
    return value(name).template item<T>();
  }
  // obj.load_state_dict(at(name)).
  template <LoadsStateDict T>
  void load_into(std::string_view name, T& object) const {
    object.load_state_dict(at(name));
  }
  std::vector<std::string> part_names() const;
  std::vector<std::string> value_names() const;

 private:
  friend Checkpoint load_checkpoint(const std::string& path, std::optional<Device> device);
  std::vector<std::pair<std::string, StateDict>> parts_;
  StateDict values_;
};

// Reads a file written by save_checkpoint (validated as tg::load validates, then
// its layout against the metadata); tensors on the CPU, or on `device` when given.
Checkpoint load_checkpoint(const std::string& path, std::optional<Device> device = std::nullopt);

}  // namespace tg
