// Hook registries and the handle that removes a hook, shared by the tensor hooks
// (Tensor::register_hook, autograd/) and nn::Module's forward hooks (nn/module.h).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace tg {

// What register_hook and the module hook registrations return. remove() unregisters the
// hook; calling it again, or after the tensor or module is gone, does nothing. Dropping the
// handle keeps the hook (as PyTorch's RemovableHandle).
class RemovableHandle {
 public:
  RemovableHandle() = default;
  explicit RemovableHandle(std::function<void()> remover) : remover_(std::move(remover)) {}
  void remove() {
    if (!remover_) return;
    auto f = std::move(remover_);
    remover_ = nullptr;
    f();
  }

 private:
  std::function<void()> remover_;
};

namespace detail {
// Hooks in registration order; `slot` says which output (of a node) a tensor hook is for.
template <typename Fn>
struct HookList {
  struct Entry {
    uint64_t id;
    uint32_t slot;
    Fn fn;
  };
  std::vector<Entry> entries;
  uint64_t next_id = 0;

  bool empty() const { return entries.empty(); }
  // The hooks for `slot`, copied: a hook may remove itself (or others) while they run.
  std::vector<Fn> for_slot(uint32_t slot) const {
    std::vector<Fn> out;
    for (const Entry& e : entries)
      if (e.slot == slot) out.push_back(e.fn);
    return out;
  }
};

// A user's hook as a std::function<T(Args...)>: it may return void or std::optional<T> (kept:
// T(), an undefined tensor) or T itself.
template <typename Sig>
struct ReplacingHook;
template <typename T, typename... Args>
struct ReplacingHook<T(Args...)> {
  template <typename F>
  static std::function<T(Args...)> wrap(F&& fn) {
    using R = std::invoke_result_t<F&, Args...>;
    if constexpr (std::is_void_v<R>) {
      return [f = std::forward<F>(fn)](Args... a) mutable -> T {
        f(a...);
        return T();
      };
    } else if constexpr (std::is_same_v<std::remove_cvref_t<R>, std::optional<T>>) {
      return [f = std::forward<F>(fn)](Args... a) mutable -> T {
        std::optional<T> r = f(a...);
        return r ? *std::move(r) : T();
      };
    } else {
      static_assert(std::is_convertible_v<R, T>, "a hook must return void, the value or std::optional of it");
      return std::function<T(Args...)>(std::forward<F>(fn));
    }
  }
};

template <typename Fn>
RemovableHandle add_hook(const std::shared_ptr<HookList<Fn>>& list, uint32_t slot, Fn fn) {
  const uint64_t id = list->next_id++;
  list->entries.push_back({id, slot, std::move(fn)});
  return RemovableHandle([weak = std::weak_ptr<HookList<Fn>>(list), id] {
    if (auto l = weak.lock()) std::erase_if(l->entries, [id](const auto& e) { return e.id == id; });
  });
}
}  // namespace detail

}  // namespace tg
