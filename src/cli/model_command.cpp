// `radixtier model`: a model preset or a config.json as the simulator sees it: the layers,
// element types, KV bytes per token, snapshot bytes and weight bytes (docs/simulator.md).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.hpp"
#include "sim/model_config.hpp"

namespace {

using namespace radixtier;

struct ModelArgs {
  std::string model = "qwen3-next-80b";
  sim::ModelDtypes dtypes;
  bool json = false, all = false;
};

void print(const sim::ModelGeometry& m) {
  std::printf(
      "%s (%s)%s%s\n"
      "  layers: %u full attention + %u Gated DeltaNet\n"
      "  attention: %u KV heads x head_dim %u, KV %s (%u B) + %u B scales per head\n"
      "  GDN: Hk %u x Dk %u, Hv %u x Dv %u, conv kernel %u; recurrent %s (%u B), conv %s (%u "
      "B), extra %llu B per slot\n"
      "  KV bytes per token: %llu\n"
      "  snapshot bytes:     %llu\n"
      "  weight bytes:       %llu (%s)\n",
      m.name.c_str(), m.origin.c_str(), m.description.empty() ? "" : "\n  ", m.description.c_str(),
      m.full_layers, m.gdn_layers, m.kv_heads, m.head_dim, m.kv_dtype.c_str(), m.kv_element_bytes,
      m.kv_scale_bytes, m.key_heads, m.key_dim, m.value_heads, m.value_dim, m.conv_kernel,
      m.recurrent_dtype.c_str(), m.recurrent_element_bytes, m.conv_dtype.c_str(),
      m.conv_element_bytes, static_cast<unsigned long long>(m.extra_state_bytes),
      static_cast<unsigned long long>(m.kv_bytes_per_token()),
      static_cast<unsigned long long>(m.snapshot_bytes()),
      static_cast<unsigned long long>(m.weight_bytes), m.weight_source.c_str());
}

nlohmann::ordered_json to_json(const sim::ModelGeometry& m) {
  nlohmann::ordered_json o;
  o["name"] = m.name;
  o["origin"] = m.origin;
  o["full_layers"] = m.full_layers;
  o["gdn_layers"] = m.gdn_layers;
  o["kv_heads"] = m.kv_heads;
  o["head_dim"] = m.head_dim;
  o["kv_dtype"] = m.kv_dtype;
  o["kv_scale_bytes"] = m.kv_scale_bytes;
  o["key_heads"] = m.key_heads;
  o["value_heads"] = m.value_heads;
  o["key_dim"] = m.key_dim;
  o["value_dim"] = m.value_dim;
  o["conv_kernel"] = m.conv_kernel;
  o["recurrent_dtype"] = m.recurrent_dtype;
  o["conv_dtype"] = m.conv_dtype;
  o["extra_state_bytes"] = m.extra_state_bytes;
  o["kv_bytes_per_token"] = m.kv_bytes_per_token();
  o["snapshot_bytes"] = m.snapshot_bytes();
  o["weight_bytes"] = m.weight_bytes;
  o["weight_source"] = m.weight_source;
  return o;
}

int run_model(const ModelArgs& a) {
  std::vector<sim::ModelGeometry> models;
  if (a.all) {
    for (const sim::ModelGeometry& p : sim::model_presets()) {
      auto m = sim::resolve_model(p.name, a.dtypes);
      if (!m) {
        std::fprintf(stderr, "radixtier model: %s\n", m.status().message().c_str());
        return 2;
      }
      models.push_back(std::move(*m));
    }
  } else {
    auto m = sim::resolve_model(a.model, a.dtypes);
    if (!m) {
      std::fprintf(stderr, "radixtier model: %s\n", m.status().message().c_str());
      return 2;
    }
    models.push_back(std::move(*m));
  }
  if (a.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& m : models) out.push_back(to_json(m));
    std::printf("%s\n", (a.all ? out : out[0])
                            .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
                            .c_str());
  } else {
    for (const auto& m : models) print(m);
  }
  return 0;
}

radixtier::cli::CommandRun setup_model(CLI::App& app) {
  auto a = std::make_shared<ModelArgs>();
  auto dtype =
      radixtier::cli::parsed_by([](const std::string& t) { return sim::dtype_bytes(t); }, "DTYPE");
  app.add_option("--model", a->model,
                 "a model preset or the path of a Hugging Face config.json of a hybrid model")
      ->capture_default_str();
  app.add_flag("--all", a->all, "every preset");
  app.add_option("--kv-dtype", a->dtypes.kv, "KV cache element type")->check(dtype);
  app.add_option("--recurrent-dtype", a->dtypes.recurrent, "GDN recurrent state element type")
      ->check(dtype);
  app.add_option("--conv-dtype", a->dtypes.conv, "GDN conv state element type")->check(dtype);
  app.add_flag("--json", a->json, "JSON on stdout");
  return [a] { return run_model(*a); };
}

const radixtier::cli::CommandRegistrar kModel{
    "model", "a model preset or config.json: its KV, snapshot and weight bytes", &setup_model};

}  // namespace
