// A tiny deterministic hybrid model (fp32, CPU): the reference model the cache is tested with.
//
// Architecture (see docs/model.md): token embedding, then a stack of layers given by a pattern
// string, 'G' = Gated DeltaNet layer, 'A' = causal softmax attention layer; each layer is
// pre-norm (RMSNorm) mixer + residual, followed by a pre-norm SwiGLU MLP + residual; a final
// RMSNorm and an output projection to logits.
//
// Memory the cache manages is the model's real memory:
//   - KV pool: the K/V of the token at position p lives in GPU page page_table[p / page_size]
//     (HostArenas::gpu_page) at slot p % page_size. Layout inside one page (fp32):
//       [attn_layer][K|V][token_in_page][kv_head][head_dim]
//   - Live recurrent state: one contiguous byte buffer of state_bytes() holding, for every GDN
//     layer in order, its conv state [conv_kernel-1][conv channels] (oldest input first) then
//     its recurrent state [head][head_dim (v)][head_dim (k)]. Nothing else. A snapshot is a
//     verbatim copy of it.
//
// Determinism: every token is computed strictly in sequence with a fixed summation order, so
// the logits, the state and the page bytes are bit-identical whichever way a sequence is split
// into forward() calls (one shot, chunked prefill of any sizes, token-by-token decode).
// Weights come from a splitmix64 stream seeded by `seed` (no <random> distributions).
// forward() is const and keeps no per-call state in the model: several threads may run
// forward() on one model concurrently for different requests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "radixtier/ids.hpp"
#include "radixtier/status.hpp"
#include "radixtier/transfer/host_transfer_engine.hpp"

namespace radixtier::model {

struct TinyModelConfig {
  std::uint32_t vocab = 97;       ///< token ids are in [0, vocab)
  std::uint32_t d_model = 32;     ///< residual stream width
  std::string layers = "GGAGGA";  ///< 'G' = Gated DeltaNet, 'A' = attention; needs both
  std::uint32_t heads = 4;        ///< query heads (attention) and heads (GDN)
  std::uint32_t head_dim = 8;     ///< per head; even (rotary embedding in attention)
  std::uint32_t kv_heads = 2;     ///< attention K/V heads; divides heads (grouped queries)
  std::uint32_t conv_kernel = 4;  ///< GDN short conv width; the state keeps kernel-1 inputs
  std::uint32_t mlp_dim = 64;     ///< SwiGLU hidden width
  std::uint32_t page_size = 16;   ///< tokens per KV page (must match the cache's page_size)
  std::uint64_t seed = 0x5EEDu;   ///< weight seed

  /// Rejects nonsense with a message naming the field.
  Status validate() const;
};

class TinyHybridModel {
 public:
  /// `config` must validate (asserted); call TinyModelConfig::validate() first on user input.
  explicit TinyHybridModel(TinyModelConfig config);

  const TinyModelConfig& config() const { return cfg_; }
  std::uint32_t vocab() const { return cfg_.vocab; }
  std::uint32_t page_size() const { return cfg_.page_size; }
  std::size_t attention_layers() const { return n_attn_; }
  std::size_t gdn_layers() const { return n_gdn_; }

  /// Bytes of one KV page: attention layers x 2 (K,V) x page_size x kv_heads x head_dim x 4.
  std::size_t page_bytes() const { return page_bytes_; }
  /// Bytes of the live recurrent state (= one snapshot): every GDN layer's conv state
  /// (kernel-1) x 3*heads*head_dim floats plus recurrent state heads x head_dim^2 floats.
  std::size_t state_bytes() const { return state_bytes_; }
  /// Pages a sequence of `tokens` tokens occupies.
  std::size_t pages_for(std::size_t tokens) const {
    return (tokens + cfg_.page_size - 1) / cfg_.page_size;
  }

  /// Writes the initial (all-zero) recurrent state into `state` (every byte of the span).
  void reset_state(std::span<std::byte> state) const;

  /// Runs tokens at positions [pos, pos + tokens.size()). The K/V of positions < pos are read
  /// from the pages of `page_table` in `mem`'s GPU KV arena; the K/V of the new tokens are
  /// written there. `state` (state_bytes()) is the live recurrent state after `pos` tokens on
  /// entry and after pos + tokens.size() tokens on return. The logits of the last token are
  /// written to `last_logits` (vocab floats). On any error nothing is written anywhere.
  Status forward(std::span<const Token> tokens, std::size_t pos,
                 std::span<const GpuPageId> page_table, HostArenas& mem, std::span<std::byte> state,
                 std::span<float> last_logits) const;

  /// A state forward() copies out on its way: the state after `tokens` of the call's tokens
  /// (0 < tokens < the call's), into `state` (state_bytes()).
  struct Capture {
    std::size_t tokens = 0;
    std::span<std::byte> state;
  };
  /// As forward(), also writing each capture (ascending by tokens). kInvalidArgument for a
  /// capture out of order, out of range or of the wrong size, and nothing is written.
  Status forward(std::span<const Token> tokens, std::size_t pos,
                 std::span<const GpuPageId> page_table, HostArenas& mem, std::span<std::byte> state,
                 std::span<float> last_logits, std::span<const Capture> captures) const;

  /// As forward(), but writes the logits of every token: `all_logits` holds
  /// tokens.size() x vocab floats, token-major.
  Status forward_all(std::span<const Token> tokens, std::size_t pos,
                     std::span<const GpuPageId> page_table, HostArenas& mem,
                     std::span<std::byte> state, std::span<float> all_logits) const;

  /// Index of the largest logit (the lowest index among equal ones). logits.size() == vocab.
  Token greedy(std::span<const float> logits) const;

 private:
  struct GdnWeights {
    std::vector<float> w_qkv;      // [3*H*D][d_model]: q, k, v
    std::vector<float> conv;       // [3*H*D][kernel]: tap kernel-1 multiplies the current input
    std::vector<float> w_a;        // [H][d_model] decay gate input
    std::vector<float> a_bias;     // [H] (dt bias)
    std::vector<float> a_log;      // [H] decay rate: g = -exp(a_log) * softplus(w_a h + a_bias)
    std::vector<float> w_b;        // [H][d_model] write strength: beta = sigmoid(w_b h)
    std::vector<float> w_z;        // [H*D][d_model] output gate
    std::vector<float> o_norm;     // [D] per-head RMSNorm weight on the output
    std::vector<float> w_o;        // [d_model][H*D]
    std::size_t state_offset = 0;  // in floats, into the state buffer
  };
  struct AttnWeights {
    std::vector<float> w_q;  // [H*D][d_model]
    std::vector<float> w_k;  // [Hkv*D][d_model]
    std::vector<float> w_v;  // [Hkv*D][d_model]
    std::vector<float> w_o;  // [d_model][H*D]
    std::size_t index = 0;   // attention layer index in the page layout
  };
  struct Layer {
    bool is_attention = false;
    std::vector<float> norm1, norm2;  // [d_model] RMSNorm weights (mixer, MLP)
    GdnWeights gdn;
    AttnWeights attn;
    std::vector<float> w_gate, w_up;  // [mlp][d_model]
    std::vector<float> w_down;        // [d_model][mlp]
  };
  struct Scratch;

  Status validate_call(std::span<const Token> tokens, std::size_t pos,
                       std::span<const GpuPageId> page_table, HostArenas& mem,
                       std::span<std::byte> state) const;
  Status run(std::span<const Token> tokens, std::size_t pos, std::span<const GpuPageId> page_table,
             std::span<const Capture> captures, HostArenas& mem, std::span<std::byte> state,
             std::span<float> logits, bool all) const;
  void step(Token token, std::size_t pos, std::span<float* const> pages, float* state, Scratch& s,
            float* logits) const;
  void gdn_step(const Layer& layer, const float* h, float* state, Scratch& s, float* out) const;
  void attn_step(const Layer& layer, const float* h, std::size_t pos, std::span<float* const> pages,
                 Scratch& s, float* out) const;

  TinyModelConfig cfg_;
  std::size_t n_attn_ = 0, n_gdn_ = 0;
  std::size_t page_bytes_ = 0, state_bytes_ = 0;
  std::size_t conv_channels_ = 0;  // 3 * heads * head_dim
  std::vector<float> embed_;       // [vocab][d_model]
  std::vector<Layer> layers_;
  std::vector<float> final_norm_;      // [d_model]
  std::vector<float> lm_head_;         // [vocab][d_model]
  std::vector<double> rope_inv_freq_;  // [head_dim/2] rotary angle per position, per pair
};

}  // namespace radixtier::model
