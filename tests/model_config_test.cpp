// Models as data: the shipped presets' config.json files, config.json parsing and its errors.
#include "sim/model_config.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

namespace radixtier::sim {
namespace {

std::string preset_path(const char* name) {
  return (std::filesystem::path(__FILE__).parent_path() / ".." / "bench" / "models" /
          (std::string(name) + ".json"))
      .string();
}

nlohmann::json preset_json(const char* name) {
  std::ifstream in(preset_path(name));
  return nlohmann::json::parse(in);
}

/// The error of parsing `j`; empty when it parses.
std::string error_of(const nlohmann::json& j) {
  auto m = parse_model_config(j.dump(), "test", "test.json");
  return m ? std::string() : m.status().message();
}

TEST(ModelConfig, ShippedConfigFilesGiveTheBytesToTheByte) {
  // The numbers of /work/shared/reference/workloads.md, from the files and from the presets.
  for (bool from_file : {true, false}) {
    SCOPED_TRACE(from_file ? "file" : "preset");
    auto qwen = from_file ? load_model_config(preset_path("qwen3-next-80b"))
                          : resolve_model("qwen3-next-80b");
    ASSERT_TRUE(qwen.is_ok()) << qwen.status().to_string();
    EXPECT_EQ(qwen->full_layers, 12u);
    EXPECT_EQ(qwen->gdn_layers, 36u);
    EXPECT_EQ(qwen->kv_bytes_per_token(), 24'576u);
    EXPECT_EQ(qwen->snapshot_bytes(), 77'266'944u);
    EXPECT_EQ(qwen->weight_bytes, 80'000'000'000u);
    auto seed =
        from_file ? load_model_config(preset_path("seed-hybrid")) : resolve_model("seed-hybrid");
    ASSERT_TRUE(seed.is_ok()) << seed.status().to_string();
    EXPECT_EQ(seed->kv_bytes_per_token(), 12'480u);
    EXPECT_EQ(seed->snapshot_bytes(), 115'642'376u);
    EXPECT_EQ(seed->weight_bytes, 80'000'000'000u);
  }
  // Every embedded preset parses and find_model() finds it by its file name.
  ASSERT_EQ(model_presets().size(), 3u);
  EXPECT_EQ(model_presets()[0].name, "qwen3-next-80b");
  EXPECT_EQ(model_presets()[1].name, "qwen3-next-80b-bf16-state");  // vLLM's state dtype
  EXPECT_EQ(model_presets()[2].name, "seed-hybrid");
  EXPECT_EQ(find_model("seed-hybrid")->snapshot_bytes(), 115'642'376u);
}

TEST(ModelConfig, StateDtypesDefaultAsTheEnginesAndCanBeOverridden) {
  const ModelGeometry qwen = *resolve_model("qwen3-next-80b");
  EXPECT_EQ(qwen.recurrent_dtype, "float32");  // SGLang's default (docs/simulator.md)
  EXPECT_EQ(qwen.conv_dtype, "bfloat16");      // the model dtype
  EXPECT_EQ(qwen.kv_dtype, "bfloat16");
  // bf16 recurrent state halves its part: 36 x 32 x 128 x 128 x 2 fewer bytes.
  ModelDtypes d;
  d.recurrent = "bfloat16";
  auto bf16 = resolve_model("qwen3-next-80b", d);
  ASSERT_TRUE(bf16.is_ok());
  EXPECT_EQ(bf16->snapshot_bytes(), 77'266'944u - 36u * 32 * 128 * 128 * 2);
  d = {};
  d.kv = "fp8";
  EXPECT_EQ(resolve_model("qwen3-next-80b", d)->kv_bytes_per_token(), 12'288u);
  // The config's mamba_ssm_dtype (Qwen3.5 configs carry it) is read as the engines read it.
  nlohmann::json j = preset_json("qwen3-next-80b");
  j["mamba_ssm_dtype"] = "bfloat16";
  auto m = parse_model_config(j.dump(), "x", "x.json");
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->snapshot_bytes(), bf16->snapshot_bytes());
  d = {};
  d.conv = "int4";
  auto bad = resolve_model("qwen3-next-80b", d);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--conv-dtype"), std::string::npos);
  EXPECT_NE(bad.status().message().find("int4"), std::string::npos);
}

TEST(ModelConfig, LayerTypesAndTextConfigAreRead) {
  nlohmann::json j = preset_json("qwen3-next-80b");
  j.erase("full_attention_interval");
  nlohmann::json types = nlohmann::json::array();
  for (int i = 0; i < 48; ++i)
    types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  j["layer_types"] = types;
  auto m = parse_model_config(j.dump(), "x", "x.json");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->kv_bytes_per_token(), 24'576u);
  EXPECT_EQ(m->snapshot_bytes(), 77'266'944u);
  // A multimodal release: the text model's fields under text_config.
  nlohmann::json vl;
  vl["model_type"] = "qwen3_5";
  vl["text_config"] = j;
  vl["text_config"].erase("radixtier");
  vl["radixtier"] = j["radixtier"];
  auto t = parse_model_config(vl.dump(), "vl", "vl.json");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->snapshot_bytes(), 77'266'944u);
  // head_dim defaults to hidden_size / num_attention_heads, as in transformers.
  j.erase("head_dim");
  EXPECT_EQ(parse_model_config(j.dump(), "x", "x.json")->head_dim, 2048u / 16);
}

TEST(ModelConfig, WeightBytesAreEstimatedFromTheParameterCountWithoutTheRadixtierKey) {
  nlohmann::json j = preset_json("qwen3-next-80b");
  j.erase("radixtier");
  auto m = parse_model_config(j.dump(), "x", "x.json");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  // Qwen3-Next-80B-A3B: 80B parameters (model card), bf16.
  EXPECT_NEAR(double(m->weight_bytes) / 2, 80e9, 0.01 * 80e9) << m->weight_source;
  EXPECT_NE(m->weight_source.find("estimated"), std::string::npos);
  j["quantization_config"] = {{"quant_method", "fp8"}};
  EXPECT_EQ(parse_model_config(j.dump(), "x", "x.json")->weight_bytes, m->weight_bytes / 2);
  // Without the fields the estimate needs, the weights are unknown and the GPU budget says so.
  j.erase("hidden_size");
  auto unknown = parse_model_config(j.dump(), "x", "x.json");
  ASSERT_TRUE(unknown.is_ok());
  EXPECT_EQ(unknown->weight_bytes, 0u);
  auto budget = gpu_cache_bytes(*find_hardware("h200-gen5"), *unknown);
  ASSERT_FALSE(budget.is_ok());
  EXPECT_NE(budget.status().message().find("weight_bytes"), std::string::npos);
}

TEST(ModelConfig, IncompleteConfigsNameTheMissingField) {
  for (const char* field : {"num_hidden_layers", "num_key_value_heads", "head_dim",
                            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                            "linear_value_head_dim", "linear_conv_kernel_dim"}) {
    nlohmann::json j = preset_json("seed-hybrid");  // no hidden_size: head_dim is required
    j.erase(field);
    const std::string e = error_of(j);
    EXPECT_NE(e.find(std::string("\"") + field + "\" is missing"), std::string::npos)
        << field << ": " << e;
    EXPECT_NE(e.find("test.json"), std::string::npos) << e;
  }
  nlohmann::json j = preset_json("qwen3-next-80b");
  j.erase("full_attention_interval");
  EXPECT_NE(error_of(j).find("\"layer_types\" is missing"), std::string::npos) << error_of(j);
  j = preset_json("qwen3-next-80b");
  j.erase("torch_dtype");
  EXPECT_NE(error_of(j).find("\"torch_dtype\" is missing"), std::string::npos) << error_of(j);
  j["dtype"] = "bfloat16";  // the newer transformers name
  EXPECT_EQ(error_of(j), "");
}

TEST(ModelConfig, MalformedConfigsNameTheField) {
  auto check = [](const char* field, const nlohmann::json& value, const char* what) {
    nlohmann::json j = preset_json("qwen3-next-80b");
    j[field] = value;
    const std::string e = error_of(j);
    EXPECT_NE(e.find(std::string("\"") + field), std::string::npos) << field << ": " << e;
    EXPECT_NE(e.find(what), std::string::npos) << field << ": " << e;
  };
  check("num_key_value_heads", "2", "positive integer");
  check("head_dim", 0, "positive integer");
  check("linear_key_head_dim", -128, "positive integer");
  check("linear_conv_kernel_dim", 3.5, "positive integer");
  check("full_attention_interval", nullptr, "\"layer_types\" is missing");
  check("torch_dtype", "int3", "unknown element type");
  check("torch_dtype", 16, "must be a string");
  check("layer_types", nlohmann::json::array({"full_attention"}), "1 entries");
  nlohmann::json types = nlohmann::json::array();
  for (int i = 0; i < 48; ++i) types.push_back(i == 5 ? "sliding_attention" : "full_attention");
  check("layer_types", types, "layer_types[5]");
  check("full_attention_interval", 1, "no linear_attention layer");
  check("radixtier", 3, "must be an object");
  nlohmann::json j = preset_json("seed-hybrid");
  j["radixtier"]["kv_cache_dtype"] = "fp9";
  EXPECT_NE(error_of(j).find("\"radixtier.kv_cache_dtype\""), std::string::npos) << error_of(j);
  j = preset_json("seed-hybrid");
  j["radixtier"]["extra_state_bytes"] = "184328";
  EXPECT_NE(error_of(j).find("\"radixtier.extra_state_bytes\""), std::string::npos);
  // Geometries no model has, whose byte counts would break the simulator's arithmetic (a
  // head_dim of 0 divided by zero; a wrapped state size ran with a third of the bytes).
  j = preset_json("qwen3-next-80b");
  j.erase("head_dim");
  j["hidden_size"] = 4;
  j["num_attention_heads"] = 8;
  EXPECT_NE(error_of(j).find("head_dim 0"), std::string::npos) << error_of(j);
  j = preset_json("seed-hybrid");
  j["radixtier"]["extra_state_bytes"] = std::numeric_limits<std::uint64_t>::max();
  EXPECT_NE(error_of(j).find("2^40 bytes per snapshot"), std::string::npos) << error_of(j);
  j = preset_json("qwen3-next-80b");
  j["linear_value_head_dim"] = std::numeric_limits<std::uint32_t>::max();
  j["linear_key_head_dim"] = std::numeric_limits<std::uint32_t>::max();
  EXPECT_NE(error_of(j).find("2^40 bytes per snapshot"), std::string::npos) << error_of(j);
  j = preset_json("qwen3-next-80b");
  j["num_key_value_heads"] = std::numeric_limits<std::uint32_t>::max();
  EXPECT_NE(error_of(j).find("2^32 bytes of KV per token"), std::string::npos) << error_of(j);
  // Not JSON, not an object, not a file, not a preset.
  auto bad = parse_model_config("{\"num_hidden_layers\": 48,", "x", "broken.json");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("broken.json"), std::string::npos);
  EXPECT_NE(bad.status().message().find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_model_config("[1]", "x", "a.json").status().message().find("object"),
            std::string::npos);
  EXPECT_EQ(load_model_config("/nonexistent/config.json").status().code(), ErrorCode::kNotFound);
  auto none = resolve_model("llama-7b");
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(none.status().message().find("qwen3-next-80b"), std::string::npos);
}

TEST(ModelConfig, AConfigPathResolvesLikeAPreset) {
  auto m = resolve_model(preset_path("seed-hybrid"));
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->name, preset_path("seed-hybrid"));
  EXPECT_EQ(m->snapshot_bytes(), 115'642'376u);
  EXPECT_EQ(m->kv_dtype, "fp8");
}

}  // namespace
}  // namespace radixtier::sim
