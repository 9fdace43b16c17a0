// save_checkpoint / load_checkpoint: parts and values in one safetensors file.
#include <tapegrad/nn/checkpoint.h>

#include <algorithm>
#include <cctype>
#include <set>

#include <tapegrad/nn/serialize.h>

namespace tg {

namespace {
// Metadata keys and the format tag.
constexpr const char* kFormatKey = "format";
constexpr const char* kFormat = "tapegrad.checkpoint";
constexpr const char* kPartsKey = "parts";
constexpr const char* kValuesKey = "values";

bool valid_name(const std::string& n) {
  if (n.empty()) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}
}  // namespace

void save_checkpoint(const std::string& path, const std::vector<CheckpointEntry>& entries) {
  std::set<std::string> seen;
  std::vector<std::string> parts, values;
  StateDict flat;
  for (const CheckpointEntry& e : entries) {
    TG_CHECK(valid_name(e.name()), "save_checkpoint('", path, "'): invalid entry name '", e.name(),
             "' (letters, digits, '_' and '-' only)");
    TG_CHECK(seen.insert(e.name()).second, "save_checkpoint('", path, "'): entry '", e.name(), "' appears twice");
    if (e.is_part()) {
      parts.push_back(e.name());
      for (const auto& [key, t] : e.part()) {
        TG_CHECK(t.defined(), "save_checkpoint('", path, "'): part '", e.name(), "' entry '", key, "' is undefined");
        flat.insert(e.name() + "." + key, t);
      }
    } else {
      TG_CHECK(e.value().defined(), "save_checkpoint('", path, "'): value '", e.name(), "' is undefined");
      values.push_back(e.name());
      flat.insert(e.name(), e.value());
    }
  }
  save(flat, path, {{kFormatKey, kFormat}, {kPartsKey, join(parts)}, {kValuesKey, join(values)}});
}

Checkpoint load_checkpoint(const std::string& path, std::optional<Device> device) {
  const SafetensorsMetadata meta = load_metadata(path);
  auto get = [&](const char* key) -> const std::string* {
    auto it = meta.find(key);
    return it == meta.end() ? nullptr : &it->second;
  };
  const std::string* format = get(kFormatKey);
  TG_CHECK(format != nullptr && *format == kFormat, "load_checkpoint('", path,
           "'): not a file written by save_checkpoint (its __metadata__ has no \"format\": \"", kFormat,
           "\"); read it with tg::load");
  const std::string* parts_s = get(kPartsKey);
  const std::string* values_s = get(kValuesKey);
  TG_CHECK(parts_s != nullptr && values_s != nullptr, "load_checkpoint('", path,
           "'): the __metadata__ lacks \"parts\" or \"values\"");
  const std::vector<std::string> part_names = split(*parts_s), value_names = split(*values_s);
  std::set<std::string> names;
  for (const auto* list : {&part_names, &value_names})
    for (const auto& n : *list) {
      TG_CHECK(valid_name(n), "load_checkpoint('", path, "'): invalid entry name '", n, "' in the __metadata__");
      TG_CHECK(names.insert(n).second, "load_checkpoint('", path, "'): entry '", n, "' is listed twice");
    }

  const StateDict flat = load(path, device);
  Checkpoint ck;
  for (const auto& n : part_names) ck.parts_.emplace_back(n, StateDict());
  for (const auto& [key, t] : flat) {
    const size_t dot = key.find('.');
    if (dot == std::string::npos) {
      TG_CHECK(std::find(value_names.begin(), value_names.end(), key) != value_names.end(), "load_checkpoint('", path,
               "'): tensor '", key, "' is not a value the __metadata__ lists");
      ck.values_.insert(key, t);
      continue;
    }
    const std::string part = key.substr(0, dot);
    auto it = std::find_if(ck.parts_.begin(), ck.parts_.end(), [&](const auto& p) { return p.first == part; });
    TG_CHECK(it != ck.parts_.end(), "load_checkpoint('", path, "'): tensor '", key,
             "' belongs to no part the __metadata__ lists (", *parts_s, ")");
    it->second.insert(key.substr(dot + 1), t);
  }
  for (const auto& n : value_names)
    TG_CHECK(ck.values_.contains(n), "load_checkpoint('", path, "'): value '", n, "' is listed but not stored");
  return ck;
}

bool Checkpoint::contains(std::string_view name) const {
  if (values_.contains(name)) return true;
  for (const auto& [n, sd] : parts_)
    if (n == name) return true;
  return false;
}

const StateDict& Checkpoint::at(std::string_view name) const {
  for (const auto& [n, sd] : parts_)
    if (n == name) return sd;
  TG_ERROR("Checkpoint: no part named '", name, "' (parts: ", join(part_names()), ")");
}

const Tensor& Checkpoint::value(std::string_view name) const {
  const Tensor* t = values_.find(name);
  TG_CHECK(t != nullptr, "Checkpoint: no value named '", name, "' (values: ", join(value_names()), ")");
  return *t;
}

std::vector<std::string> Checkpoint::part_names() const {
  std::vector<std::string> out;
  for (const auto& [n, sd] : parts_) out.push_back(n);
  return out;
}

std::vector<std::string> Checkpoint::value_names() const { return values_.keys(); }

}  // namespace tg
