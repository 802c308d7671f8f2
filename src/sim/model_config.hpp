// Models as data: a Hugging Face config.json of a hybrid (full attention + Gated DeltaNet)
// model becomes a ModelGeometry (docs/simulator.md, "Models as data").
//
// Read from the config (Qwen3-Next field names; a `text_config` object is used when the top
// level has no `num_hidden_layers`, as in the Qwen3.5 releases):
//   layer_types (each "full_attention" or "linear_attention") or full_attention_interval
//   (layer i is full attention when (i + 1) % interval == 0), num_hidden_layers,
//   num_key_value_heads, head_dim (else hidden_size / num_attention_heads),
//   linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
//   linear_conv_kernel_dim, torch_dtype or dtype, mamba_ssm_dtype (optional).
// radixtier's own keys live in a top-level "radixtier" object (all optional):
//   kv_cache_dtype, kv_scale_bytes, recurrent_state_dtype, conv_state_dtype,
//   extra_state_bytes, weight_bytes, name, description.
// Element types (first given wins):
//   KV         ModelDtypes::kv, radixtier.kv_cache_dtype, the model dtype
//   recurrent  ModelDtypes::recurrent, radixtier.recurrent_state_dtype, mamba_ssm_dtype, float32
//   conv       ModelDtypes::conv, radixtier.conv_state_dtype, the model dtype
// Weights: radixtier.weight_bytes, else the estimated parameter count x the weight element
// bytes (1 with an fp8 quantization_config, else the model dtype), else 0 (unknown).
//
// The presets are the files of bench/models/, embedded into the binary at build time
// (cmake/embed_models.cmake): model_presets() and find_model() in cost_model.hpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "radixtier/status.hpp"
#include "sim/cost_model.hpp"

namespace radixtier::sim {

/// Element types that override the config's (names as in config.json: "bfloat16", "float16",
/// "float32", "fp8", ...); empty: the config's, else the default.
struct ModelDtypes {
  std::string kv;         ///< the KV cache
  std::string recurrent;  ///< the GDN recurrent state
  std::string conv;       ///< the GDN conv state
};

/// Bytes of one element of `dtype`; kInvalidArgument naming it when unknown.
Result<std::uint32_t> dtype_bytes(std::string_view dtype);

/// Parses the text of a config.json. `name` becomes ModelGeometry::name (radixtier.name
/// replaces it when given); `origin` is what errors call the file. Errors (kInvalidArgument)
/// name the field that is missing or wrong.
Result<ModelGeometry> parse_model_config(std::string_view json, std::string name,
                                         std::string_view origin,
                                         const ModelDtypes& overrides = {});
/// Reads and parses `path`; kNotFound when it cannot be read.
Result<ModelGeometry> load_model_config(const std::string& path, const ModelDtypes& overrides = {});
/// `spec`: a preset name (model_presets()) or a path to a config.json; `overrides` apply to
/// either. kNotFound naming the presets when it is neither.
Result<ModelGeometry> resolve_model(std::string_view spec, const ModelDtypes& overrides = {});

}  // namespace radixtier::sim
