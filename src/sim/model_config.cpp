// Models as data (see model_config.hpp).
#include "sim/model_config.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "sim/model_presets_data.hpp"

namespace radixtier::sim {

namespace {

/// Bounds on a geometry's byte counts (far above any model): the simulator multiplies them by
/// page and slot counts in 64 bits.
constexpr unsigned __int128 kMaxKvBytesPerToken = std::uint64_t{1} << 32;
constexpr unsigned __int128 kMaxStateBytes = std::uint64_t{1} << 40;

using nlohmann::json;

/// Reads the fields of one config object; every error names the file and the field.
class Fields {
 public:
  Fields(const json& root, const json& arch, std::string_view origin)
      : root_(root), arch_(arch), origin_(origin) {}

  Status error(const std::string& field, const std::string& what) const {
    return invalid_argument("model config '" + origin_ + "': \"" + field + "\" " + what);
  }
  const json* find(const json& obj, const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json* arch(const char* key) const { return find(arch_, key); }
  const json* extra(const char* key) const {
    const json* r = find(root_, "radixtier");
    return r == nullptr ? nullptr : find(*r, key);
  }

  /// A required positive integer of the architecture.
  Result<std::uint32_t> positive(const char* key) const {
    const json* v = arch(key);
    if (v == nullptr) return error(key, "is missing");
    return positive_value(key, *v);
  }
  Result<std::uint32_t> positive_value(const std::string& field, const json& v) const {
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() == 0 ||
        v.get<std::uint64_t>() > UINT32_MAX) {
      return error(field, "must be a positive integer below 2^32, got " + v.dump());
    }
    return static_cast<std::uint32_t>(v.get<std::uint64_t>());
  }
  /// An optional non-negative integer; `fallback` when absent.
  Result<std::uint64_t> count(const std::string& field, const json* v,
                              std::uint64_t fallback) const {
    if (v == nullptr) return fallback;
    if (!v->is_number_unsigned()) {
      return error(field, "must be a non-negative integer, got " + v->dump());
    }
    return v->get<std::uint64_t>();
  }
  /// An optional string; empty when absent.
  Result<std::string> string(const std::string& field, const json* v) const {
    if (v == nullptr) return std::string();
    if (!v->is_string()) return error(field, "must be a string, got " + v->dump());
    return v->get<std::string>();
  }
  /// The element type named by `name` (from `field`).
  Result<std::uint32_t> dtype(const std::string& field, const std::string& name) const {
    auto b = dtype_bytes(name);
    if (!b) return error(field, "names an " + b.status().message());
    return *b;
  }

 private:
  const json& root_;
  const json& arch_;
  std::string origin_;
};

/// The first of (value, where it came from) that is given.
struct Choice {
  std::string value, field;
};
Choice first_of(std::initializer_list<Choice> choices) {
  for (const Choice& c : choices) {
    if (!c.value.empty()) return c;
  }
  return {};
}

/// Parameters of a Qwen3-Next-style model: embeddings, the attention and Gated DeltaNet
/// projections, the MLP (dense or routed experts + shared expert + router). Norms, biases and
/// the per-head GDN scalars are left out (< 0.01%). nullopt when a field it needs is absent.
std::optional<std::uint64_t> estimate_parameters(const Fields& f, const ModelGeometry& m) {
  auto get = [&](const char* key) -> std::optional<std::uint64_t> {
    const json* v = f.arch(key);
    if (v == nullptr || !v->is_number_unsigned()) return std::nullopt;
    return v->get<std::uint64_t>();
  };
  const auto hidden = get("hidden_size"), vocab = get("vocab_size");
  const auto heads = get("num_attention_heads");
  if (!hidden || !vocab || !heads) return std::nullopt;
  const std::uint64_t h = *hidden;
  const json* tie = f.arch("tie_word_embeddings");
  const bool tied = tie == nullptr || !tie->is_boolean() || tie->get<bool>();
  const json* gate = f.arch("attn_output_gate");
  const bool gated = gate == nullptr || !gate->is_boolean() || gate->get<bool>();
  const std::uint64_t q = *heads * m.head_dim;
  const std::uint64_t attention = h * q * (gated ? 2 : 1) + 2 * h * m.kv_heads * m.head_dim + q * h;
  const std::uint64_t kd = std::uint64_t{m.key_heads} * m.key_dim;
  const std::uint64_t vd = std::uint64_t{m.value_heads} * m.value_dim;
  const std::uint64_t gdn =
      h * (2 * kd + 2 * vd) + h * 2 * m.value_heads + (2 * kd + vd) * m.conv_kernel + vd * h;
  std::uint64_t mlp = 0;
  const auto experts = get("num_experts");
  if (experts && *experts > 0) {
    const auto moe = get("moe_intermediate_size");
    if (!moe) return std::nullopt;
    const std::uint64_t shared = get("shared_expert_intermediate_size").value_or(0);
    mlp = *experts * 3 * h * *moe + 3 * h * shared + h * *experts + (shared > 0 ? h : 0);
  } else {
    const auto inter = get("intermediate_size");
    if (!inter) return std::nullopt;
    mlp = 3 * h * *inter;
  }
  const std::uint64_t layers = std::uint64_t{m.full_layers} + m.gdn_layers;
  return *vocab * h * (tied ? 1 : 2) + m.full_layers * attention + m.gdn_layers * gdn +
         layers * mlp;
}

std::string thousands(std::uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

Result<ModelGeometry> parse_config(const json& root, std::string name, std::string_view origin,
                                   const ModelDtypes& o) {
  if (!root.is_object()) {
    return invalid_argument("model config '" + std::string(origin) +
                            "': expected a JSON object, got " + std::string(root.type_name()));
  }
  const json* text = nullptr;
  if (!root.contains("num_hidden_layers")) {
    auto it = root.find("text_config");
    if (it != root.end() && it->is_object()) text = &*it;
  }
  const Fields f(root, text != nullptr ? *text : root, origin);
  if (const json* r = f.find(root, "radixtier"); r != nullptr && !r->is_object()) {
    return f.error("radixtier", "must be an object, got " + r->dump());
  }
  ModelGeometry m{};
  m.origin = text != nullptr ? std::string(origin) + " (text_config)" : std::string(origin);
  m.name = std::move(name);
  auto given_name = f.string("radixtier.name", f.extra("name"));
  if (!given_name) return given_name.status();
  if (!given_name->empty()) m.name = *given_name;
  auto description = f.string("radixtier.description", f.extra("description"));
  if (!description) return description.status();
  m.description = *description;

  // Layers.
  auto layers = f.positive("num_hidden_layers");
  if (!layers) return layers.status();
  const char* layer_field = "layer_types";
  if (const json* types = f.arch("layer_types"); types != nullptr) {
    if (!types->is_array()) return f.error("layer_types", "must be an array of strings");
    if (types->size() != *layers) {
      return f.error("layer_types", "has " + std::to_string(types->size()) +
                                        " entries for num_hidden_layers " +
                                        std::to_string(*layers));
    }
    for (std::size_t i = 0; i < types->size(); ++i) {
      const json& t = (*types)[i];
      if (t == "full_attention") {
        ++m.full_layers;
      } else if (t == "linear_attention") {
        ++m.gdn_layers;
      } else {
        return f.error("layer_types[" + std::to_string(i) + "]",
                       "is " + t.dump() + ": expected \"full_attention\" or \"linear_attention\"");
      }
    }
  } else if (f.arch("full_attention_interval") != nullptr) {
    layer_field = "full_attention_interval";
    auto interval = f.positive(layer_field);
    if (!interval) return interval.status();
    m.full_layers = *layers / *interval;
    m.gdn_layers = *layers - m.full_layers;
  } else {
    return f.error("layer_types", "is missing (and so is \"full_attention_interval\")");
  }
  if (m.full_layers == 0) {
    return f.error(layer_field, "gives no full_attention layer: not a hybrid model");
  }
  if (m.gdn_layers == 0) {
    return f.error(layer_field, "gives no linear_attention layer: not a hybrid model");
  }

  // Geometry.
  auto kv_heads = f.positive("num_key_value_heads");
  if (!kv_heads) return kv_heads.status();
  m.kv_heads = *kv_heads;
  if (f.arch("head_dim") == nullptr && f.arch("hidden_size") != nullptr &&
      f.arch("num_attention_heads") != nullptr) {
    auto hidden = f.positive("hidden_size");
    if (!hidden) return hidden.status();
    auto heads = f.positive("num_attention_heads");
    if (!heads) return heads.status();
    m.head_dim = *hidden / *heads;  // transformers' default when head_dim is absent
    if (m.head_dim == 0) {
      return f.error("hidden_size", "/ num_attention_heads gives head_dim 0 (" +
                                        std::to_string(*hidden) + " / " + std::to_string(*heads) +
                                        "): give \"head_dim\"");
    }
  } else {
    auto head_dim = f.positive("head_dim");
    if (!head_dim) return head_dim.status();
    m.head_dim = *head_dim;
  }
  struct {
    const char* key;
    std::uint32_t* out;
  } const gdn[] = {{"linear_num_key_heads", &m.key_heads},
                   {"linear_num_value_heads", &m.value_heads},
                   {"linear_key_head_dim", &m.key_dim},
                   {"linear_value_head_dim", &m.value_dim},
                   {"linear_conv_kernel_dim", &m.conv_kernel}};
  for (const auto& g : gdn) {
    auto v = f.positive(g.key);
    if (!v) return v.status();
    *g.out = *v;
  }

  // Element types.
  auto torch_dtype = f.string("torch_dtype", f.arch("torch_dtype"));
  if (!torch_dtype) return torch_dtype.status();
  auto dtype = f.string("dtype", f.arch("dtype"));
  if (!dtype) return dtype.status();
  const Choice model_dtype = first_of({{*torch_dtype, "torch_dtype"}, {*dtype, "dtype"}});
  auto kv_cfg = f.string("radixtier.kv_cache_dtype", f.extra("kv_cache_dtype"));
  auto rec_cfg = f.string("radixtier.recurrent_state_dtype", f.extra("recurrent_state_dtype"));
  auto conv_cfg = f.string("radixtier.conv_state_dtype", f.extra("conv_state_dtype"));
  auto ssm_cfg = f.string("mamba_ssm_dtype", f.arch("mamba_ssm_dtype"));
  for (const auto* r : {&kv_cfg, &rec_cfg, &conv_cfg, &ssm_cfg}) {
    if (!*r) return r->status();
  }
  auto element = [&](Choice c, const char* what, std::string& name_out) -> Result<std::uint32_t> {
    if (c.value.empty()) {
      return f.error("torch_dtype", std::string("is missing (and so is \"dtype\"): it gives the ") +
                                        what + " element type");
    }
    name_out = c.value;
    return f.dtype(c.field, c.value);
  };
  auto kv =
      element(first_of({{o.kv, "--kv-dtype"}, {*kv_cfg, "radixtier.kv_cache_dtype"}, model_dtype}),
              "KV cache", m.kv_dtype);
  if (!kv) return kv.status();
  m.kv_element_bytes = *kv;
  auto rec = element(first_of({{o.recurrent, "--recurrent-dtype"},
                               {*rec_cfg, "radixtier.recurrent_state_dtype"},
                               {*ssm_cfg, "mamba_ssm_dtype"},
                               {"float32", "the default"}}),
                     "recurrent state", m.recurrent_dtype);
  if (!rec) return rec.status();
  m.recurrent_element_bytes = *rec;
  auto conv = element(
      first_of({{o.conv, "--conv-dtype"}, {*conv_cfg, "radixtier.conv_state_dtype"}, model_dtype}),
      "conv state", m.conv_dtype);
  if (!conv) return conv.status();
  m.conv_element_bytes = *conv;

  // radixtier's extras.
  auto scale = f.count("radixtier.kv_scale_bytes", f.extra("kv_scale_bytes"), 0);
  if (!scale) return scale.status();
  if (*scale > UINT32_MAX) return f.error("radixtier.kv_scale_bytes", "is too large");
  m.kv_scale_bytes = static_cast<std::uint32_t>(*scale);
  auto extra = f.count("radixtier.extra_state_bytes", f.extra("extra_state_bytes"), 0);
  if (!extra) return extra.status();
  m.extra_state_bytes = *extra;
  // The byte counts every budget is made of, computed wide: a state or a KV token this large
  // is no model's, and would wrap the simulator's arithmetic (pages x bytes).
  if (m.kv_bytes_per_token_wide() > kMaxKvBytesPerToken) {
    return invalid_argument("model config '" + std::string(origin) +
                            "': the full-attention layers x KV heads x (head_dim x the KV "
                            "dtype + kv_scale_bytes) give more than 2^32 bytes of KV per "
                            "token: no model's geometry");
  }
  if (m.snapshot_bytes_wide() > kMaxStateBytes) {
    return invalid_argument("model config '" + std::string(origin) +
                            "': the GDN layers' recurrent and conv states (with "
                            "radixtier.extra_state_bytes) give more than 2^40 bytes per "
                            "snapshot: no model's geometry");
  }
  auto weights = f.count("radixtier.weight_bytes", f.extra("weight_bytes"), 0);
  if (!weights) return weights.status();
  if (*weights > 0) {
    m.weight_bytes = *weights;
    m.weight_source = "radixtier.weight_bytes";
  } else if (auto params = estimate_parameters(f, m); params) {
    std::uint32_t per_weight = 0;
    std::string weight_dtype;
    const json* q = f.find(root, "quantization_config");
    if (q == nullptr && text != nullptr) q = f.find(*text, "quantization_config");
    const json* method = q != nullptr && q->is_object() ? f.find(*q, "quant_method") : nullptr;
    if (method != nullptr && *method == "fp8") {
      per_weight = 1;
      weight_dtype = "fp8 (quantization_config)";
    } else if (!model_dtype.value.empty()) {
      auto b = f.dtype(model_dtype.field, model_dtype.value);
      if (!b) return b.status();
      per_weight = *b;
      weight_dtype = model_dtype.value;
    }
    if (per_weight > 0) {
      m.weight_bytes = *params * per_weight;
      m.weight_source = "estimated: " + thousands(*params) + " parameters x " +
                        std::to_string(per_weight) + " B (" + weight_dtype + ")";
    }
  }
  if (m.weight_bytes == 0) m.weight_source = "unknown";
  return m;
}

const std::vector<ModelGeometry>& presets() {
  static const std::vector<ModelGeometry> all = [] {
    std::vector<ModelGeometry> out;
    for (std::size_t i = 0; i < detail::kEmbeddedModelCount; ++i) {
      const detail::EmbeddedModel& e = detail::kEmbeddedModels[i];
      const std::string_view text(reinterpret_cast<const char*>(e.json), e.size);
      auto m = parse_model_config(text, e.name, std::string("preset ") + e.name);
      if (!m) {
        // A broken file in bench/models/ is a build defect (tests/model_config_test.cpp).
        std::fprintf(stderr, "radixtier: embedded model preset %s: %s\n", e.name,
                     m.status().message().c_str());
        std::abort();
      }
      out.push_back(std::move(*m));
    }
    return out;
  }();
  return all;
}

}  // namespace

Result<std::uint32_t> dtype_bytes(std::string_view dtype) {
  static constexpr struct {
    std::string_view name;
    std::uint32_t bytes;
  } kTypes[] = {{"float32", 4},     {"fp32", 4},           {"float", 4},    {"bfloat16", 2},
                {"bf16", 2},        {"float16", 2},        {"fp16", 2},     {"half", 2},
                {"fp8", 1},         {"fp8_e4m3", 1},       {"fp8_e5m2", 1}, {"float8_e4m3fn", 1},
                {"float8_e5m2", 1}, {"float8_e4m3fnuz", 1}};
  std::string known;
  for (const auto& t : kTypes) {
    if (t.name == dtype) return t.bytes;
    known += (known.empty() ? "" : ", ") + std::string(t.name);
  }
  return invalid_argument("unknown element type \"" + std::string(dtype) + "\" (known: " + known +
                          ")");
}

Result<ModelGeometry> parse_model_config(std::string_view text, std::string name,
                                         std::string_view origin, const ModelDtypes& overrides) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    return invalid_argument("model config '" + std::string(origin) +
                            "': not valid JSON: " + e.what());
  }
  return parse_config(root, std::move(name), origin, overrides);
}

Result<ModelGeometry> load_model_config(const std::string& path, const ModelDtypes& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open model config '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), path, path, overrides);
}

Result<ModelGeometry> resolve_model(std::string_view spec, const ModelDtypes& overrides) {
  std::string known;
  for (std::size_t i = 0; i < detail::kEmbeddedModelCount; ++i) {
    const detail::EmbeddedModel& e = detail::kEmbeddedModels[i];
    if (spec == e.name) {
      if (overrides.kv.empty() && overrides.recurrent.empty() && overrides.conv.empty()) {
        return presets()[i];
      }
      return parse_model_config(std::string_view(reinterpret_cast<const char*>(e.json), e.size),
                                e.name, std::string("preset ") + e.name, overrides);
    }
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::path(spec), ec)) {
    return load_model_config(std::string(spec), overrides);
  }
  return not_found("unknown model '" + std::string(spec) + "': neither a preset (known: " + known +
                   ") nor a config.json file");
}

std::span<const ModelGeometry> model_presets() {
  return presets();
}

}  // namespace radixtier::sim
