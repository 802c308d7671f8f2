#include "model/tiny_model.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <utility>

namespace radixtier::model {
namespace {

constexpr float kNormEps = 1e-6f;
constexpr std::uint32_t kMaxDim = 4096;
constexpr std::uint32_t kMaxVocab = 1u << 20;
constexpr std::size_t kMaxLayers = 64;
constexpr std::uint32_t kMaxKernel = 16;

/// splitmix64: the weight stream. Identical on every platform and standard library.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [-1, 1): 24 random bits, exact in float.
  float uniform() {
    const float u = static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
    return 2.0f * u - 1.0f;
  }
  std::vector<float> fill(std::size_t n, float scale, float offset = 0.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * uniform();
    return v;
  }

 private:
  std::uint64_t s_;
};

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

/// out[r] = sum_c w[r][c] * x[c], c ascending (a fixed summation order).
void matvec(const float* w, const float* x, std::size_t rows, std::size_t cols, float* out) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    float acc = 0.0f;
    for (std::size_t c = 0; c < cols; ++c) acc += row[c] * x[c];
    out[r] = acc;
  }
}

float dot(const float* a, const float* b, std::size_t n) {
  float acc = 0.0f;
  for (std::size_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

/// out = x / rms(x) * w.
void rmsnorm(const float* x, const float* w, std::size_t n, float* out) {
  float ss = 0.0f;
  for (std::size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + kNormEps);
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

/// x /= ||x||_2 (in place).
void l2norm(float* x, std::size_t n) {
  float ss = 0.0f;
  for (std::size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss + kNormEps);
  for (std::size_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

// --- config ------------------------------------------------------------------------------

Status TinyModelConfig::validate() const {
  auto bad = [](const std::string& what) { return invalid_argument("TinyModelConfig: " + what); };
  if (vocab < 2 || vocab > kMaxVocab) return bad("vocab must be in [2, 2^20]");
  if (d_model == 0 || d_model > kMaxDim) return bad("d_model must be in [1, 4096]");
  if (layers.empty() || layers.size() > kMaxLayers) return bad("layers must have 1..64 letters");
  if (layers.find_first_not_of("GA") != std::string::npos)
    return bad("layers may only contain 'G' (Gated DeltaNet) and 'A' (attention): \"" + layers +
               "\"");
  if (layers.find('G') == std::string::npos || layers.find('A') == std::string::npos)
    return bad("layers must contain at least one 'G' and one 'A' (a hybrid model)");
  if (heads == 0 || heads > 256) return bad("heads must be in [1, 256]");
  if (head_dim == 0 || head_dim > 256 || head_dim % 2 != 0)
    return bad("head_dim must be even and in [2, 256]");
  if (kv_heads == 0 || kv_heads > heads || heads % kv_heads != 0)
    return bad("kv_heads must divide heads");
  if (conv_kernel < 2 || conv_kernel > kMaxKernel) return bad("conv_kernel must be in [2, 16]");
  if (mlp_dim == 0 || mlp_dim > kMaxDim) return bad("mlp_dim must be in [1, 4096]");
  if (page_size == 0 || page_size > 65536) return bad("page_size must be in [1, 65536]");
  return Status::ok();
}

// --- construction --------------------------------------------------------------------------

TinyHybridModel::TinyHybridModel(TinyModelConfig config) : cfg_(std::move(config)) {
  [[maybe_unused]] const Status ok = cfg_.validate();
  assert(ok.is_ok());
  const std::size_t d = cfg_.d_model, hd = std::size_t{cfg_.heads} * cfg_.head_dim,
                    kvd = std::size_t{cfg_.kv_heads} * cfg_.head_dim, m = cfg_.mlp_dim;
  conv_channels_ = 3 * hd;

  SplitMix64 rng(cfg_.seed);
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float hd_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float m_scale = 1.0f / std::sqrt(static_cast<float>(m));

  embed_ = rng.fill(std::size_t{cfg_.vocab} * d, 1.0f);
  std::size_t state_floats = 0;
  for (char kind : cfg_.layers) {
    Layer layer;
    layer.is_attention = kind == 'A';
    layer.norm1 = rng.fill(d, 0.1f, 1.0f);
    if (layer.is_attention) {
      AttnWeights& a = layer.attn;
      a.w_q = rng.fill(hd * d, in_scale);
      a.w_k = rng.fill(kvd * d, in_scale);
      a.w_v = rng.fill(kvd * d, in_scale);
      a.w_o = rng.fill(d * hd, hd_scale);
      a.index = n_attn_++;
    } else {
      GdnWeights& g = layer.gdn;
      g.w_qkv = rng.fill(conv_channels_ * d, in_scale);
      g.conv = rng.fill(conv_channels_ * cfg_.conv_kernel, 0.6f);
      g.w_a = rng.fill(std::size_t{cfg_.heads} * d, in_scale);
      g.a_bias = rng.fill(cfg_.heads, 0.5f);
      // exp(a_log) in about [0.02, 0.08]: decays alpha ~ 0.95-0.99, a long memory.
      g.a_log = rng.fill(cfg_.heads, 0.7f, -3.2f);
      g.w_b = rng.fill(std::size_t{cfg_.heads} * d, in_scale);
      g.w_z = rng.fill(hd * d, in_scale);
      g.o_norm = rng.fill(cfg_.head_dim, 0.1f, 1.0f);
      g.w_o = rng.fill(d * hd, hd_scale);
      g.state_offset = state_floats;
      state_floats += std::size_t{cfg_.conv_kernel - 1} * conv_channels_ +
                      std::size_t{cfg_.heads} * cfg_.head_dim * cfg_.head_dim;
      ++n_gdn_;
    }
    layer.norm2 = rng.fill(d, 0.1f, 1.0f);
    layer.w_gate = rng.fill(m * d, in_scale);
    layer.w_up = rng.fill(m * d, in_scale);
    layer.w_down = rng.fill(d * m, m_scale);
    layers_.push_back(std::move(layer));
  }
  final_norm_ = rng.fill(d, 0.1f, 1.0f);
  lm_head_ = rng.fill(std::size_t{cfg_.vocab} * d, in_scale);

  rope_inv_freq_.resize(cfg_.head_dim / 2);
  for (std::size_t i = 0; i < rope_inv_freq_.size(); ++i)
    rope_inv_freq_[i] =
        std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(cfg_.head_dim));

  page_bytes_ = n_attn_ * 2 * std::size_t{cfg_.page_size} * kvd * sizeof(float);
  state_bytes_ = state_floats * sizeof(float);
}

void TinyHybridModel::reset_state(std::span<std::byte> state) const {
  std::fill(state.begin(), state.end(), std::byte{0});
}

Token TinyHybridModel::greedy(std::span<const float> logits) const {
  assert(logits.size() == cfg_.vocab);
  if (logits.empty()) return 0;
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<Token>(best);
}

// --- forward -------------------------------------------------------------------------------

struct TinyHybridModel::Scratch {
  std::vector<float> x, h, mix, qkv, q, k, v, z, o, gate, up, scores;
};

Status TinyHybridModel::validate_call(std::span<const Token> tokens, std::size_t pos,
                                      std::span<const GpuPageId> page_table, HostArenas& mem,
                                      std::span<std::byte> state) const {
  auto bad = [](const std::string& what) {
    return invalid_argument("TinyHybridModel::forward: " + what);
  };
  if (tokens.empty()) return bad("no tokens");
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || static_cast<std::uint32_t>(tokens[i]) >= cfg_.vocab) {
      std::ostringstream os;
      os << "token " << tokens[i] << " at index " << i << " is outside the vocab [0, " << cfg_.vocab
         << ")";
      return bad(os.str());
    }
  }
  if (pos > (std::numeric_limits<std::uint32_t>::max() >> 1) ||
      tokens.size() > (std::numeric_limits<std::uint32_t>::max() >> 1))
    return bad("position out of range");
  if (state.size() != state_bytes_) {
    std::ostringstream os;
    os << "state has " << state.size() << " bytes, the model's state_bytes() is " << state_bytes_;
    return bad(os.str());
  }
  if (mem.page_bytes() != page_bytes_) {
    std::ostringstream os;
    os << "the KV arena's pages have " << mem.page_bytes() << " bytes, the model's page_bytes() is "
       << page_bytes_;
    return bad(os.str());
  }
  const std::size_t need = pages_for(pos + tokens.size());
  if (page_table.size() < need) {
    std::ostringstream os;
    os << "page table has " << page_table.size() << " pages, positions [0, " << pos + tokens.size()
       << ") need " << need;
    return bad(os.str());
  }
  std::vector<std::uint32_t> ids;
  ids.reserve(need);
  for (std::size_t i = 0; i < need; ++i) {
    const GpuPageId id = page_table[i];
    if (!id.valid() || id.value() >= mem.gpu_pages()) {
      std::ostringstream os;
      os << "page table entry " << i << " (" << id << ") is outside the GPU KV arena of "
         << mem.gpu_pages() << " pages";
      return bad(os.str());
    }
    ids.push_back(id.value());
  }
  std::sort(ids.begin(), ids.end());
  if (auto it = std::adjacent_find(ids.begin(), ids.end()); it != ids.end()) {
    std::ostringstream os;
    os << "page table uses " << GpuPageId(*it) << " twice";
    return bad(os.str());
  }
  return Status::ok();
}

Status TinyHybridModel::forward(std::span<const Token> tokens, std::size_t pos,
                                std::span<const GpuPageId> page_table, HostArenas& mem,
                                std::span<std::byte> state, std::span<float> last_logits) const {
  return forward(tokens, pos, page_table, mem, state, last_logits, {});
}

Status TinyHybridModel::forward(std::span<const Token> tokens, std::size_t pos,
                                std::span<const GpuPageId> page_table, HostArenas& mem,
                                std::span<std::byte> state, std::span<float> last_logits,
                                std::span<const Capture> captures) const {
  if (last_logits.size() != cfg_.vocab) {
    std::ostringstream os;
    os << "TinyHybridModel::forward: logits span has " << last_logits.size() << " floats, vocab is "
       << cfg_.vocab;
    return invalid_argument(os.str());
  }
  std::size_t previous = 0;
  for (const Capture& c : captures) {
    if (c.tokens <= previous || c.tokens >= tokens.size() || c.state.size() != state_bytes_) {
      std::ostringstream os;
      os << "TinyHybridModel::forward: a capture after " << c.tokens << " tokens into "
         << c.state.size() << " bytes is not ascending inside (0, " << tokens.size()
         << ") tokens into state_bytes() = " << state_bytes_;
      return invalid_argument(os.str());
    }
    previous = c.tokens;
  }
  return run(tokens, pos, page_table, captures, mem, state, last_logits, false);
}

Status TinyHybridModel::forward_all(std::span<const Token> tokens, std::size_t pos,
                                    std::span<const GpuPageId> page_table, HostArenas& mem,
                                    std::span<std::byte> state, std::span<float> all_logits) const {
  if (all_logits.size() != tokens.size() * cfg_.vocab) {
    std::ostringstream os;
    os << "TinyHybridModel::forward_all: logits span has " << all_logits.size()
       << " floats, tokens x vocab is " << tokens.size() * cfg_.vocab;
    return invalid_argument(os.str());
  }
  return run(tokens, pos, page_table, {}, mem, state, all_logits, true);
}

Status TinyHybridModel::run(std::span<const Token> tokens, std::size_t pos,
                            std::span<const GpuPageId> page_table,
                            std::span<const Capture> captures, HostArenas& mem,
                            std::span<std::byte> state, std::span<float> logits, bool all) const {
  if (Status s = validate_call(tokens, pos, page_table, mem, state); !s) return s;

  const std::size_t end = pos + tokens.size();
  std::vector<float*> pages(pages_for(end));
  for (std::size_t i = 0; i < pages.size(); ++i) {
    std::span<std::byte> page = mem.gpu_page(page_table[i]);
    if (reinterpret_cast<std::uintptr_t>(page.data()) % alignof(float) != 0)
      return invalid_argument("TinyHybridModel::forward: KV arena is not float-aligned");
    pages[i] = reinterpret_cast<float*>(page.data());
  }

  // The state is worked on in an aligned copy; the caller's span may have any alignment.
  std::vector<float> live(state_bytes_ / sizeof(float));
  std::memcpy(live.data(), state.data(), state_bytes_);

  const std::size_t d = cfg_.d_model, hd = std::size_t{cfg_.heads} * cfg_.head_dim;
  Scratch s;
  s.x.resize(d);
  s.h.resize(d);
  s.mix.resize(d);
  s.qkv.resize(conv_channels_);
  s.q.resize(hd);
  s.k.resize(hd);
  s.v.resize(hd);
  s.z.resize(hd);
  s.o.resize(hd);
  s.gate.resize(cfg_.mlp_dim);
  s.up.resize(cfg_.mlp_dim);
  s.scores.resize(end);
  std::vector<float> last(cfg_.vocab);

  auto capture = captures.begin();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    float* out = all ? logits.data() + i * cfg_.vocab : last.data();
    step(tokens[i], pos + i, pages, live.data(), s, out);
    if (capture != captures.end() && capture->tokens == i + 1) {
      std::memcpy(capture->state.data(), live.data(), state_bytes_);
      ++capture;
    }
  }
  if (!all) std::copy(last.begin(), last.end(), logits.begin());
  std::memcpy(state.data(), live.data(), state_bytes_);
  return Status::ok();
}

void TinyHybridModel::step(Token token, std::size_t pos, std::span<float* const> pages,
                           float* state, Scratch& s, float* logits) const {
  const std::size_t d = cfg_.d_model;
  const float* e = embed_.data() + static_cast<std::size_t>(token) * d;
  std::copy(e, e + d, s.x.begin());

  for (const Layer& layer : layers_) {
    rmsnorm(s.x.data(), layer.norm1.data(), d, s.h.data());
    if (layer.is_attention) {
      attn_step(layer, s.h.data(), pos, pages, s, s.mix.data());
    } else {
      gdn_step(layer, s.h.data(), state, s, s.mix.data());
    }
    for (std::size_t i = 0; i < d; ++i) s.x[i] += s.mix[i];

    rmsnorm(s.x.data(), layer.norm2.data(), d, s.h.data());
    matvec(layer.w_gate.data(), s.h.data(), cfg_.mlp_dim, d, s.gate.data());
    matvec(layer.w_up.data(), s.h.data(), cfg_.mlp_dim, d, s.up.data());
    for (std::size_t i = 0; i < cfg_.mlp_dim; ++i) s.gate[i] = silu(s.gate[i]) * s.up[i];
    matvec(layer.w_down.data(), s.gate.data(), d, cfg_.mlp_dim, s.mix.data());
    for (std::size_t i = 0; i < d; ++i) s.x[i] += s.mix[i];
  }
  rmsnorm(s.x.data(), final_norm_.data(), d, s.h.data());
  matvec(lm_head_.data(), s.h.data(), cfg_.vocab, d, logits);
}

void TinyHybridModel::gdn_step(const Layer& layer, const float* h, float* state, Scratch& s,
                               float* out) const {
  const GdnWeights& g = layer.gdn;
  const std::size_t d = cfg_.d_model, H = cfg_.heads, D = cfg_.head_dim, C = conv_channels_,
                    K = cfg_.conv_kernel, hd = H * D;
  float* conv_state = state + g.state_offset;  // [K-1][C], oldest first
  float* rec = conv_state + (K - 1) * C;       // [H][D (v)][D (k)]

  // Projection, then the causal depthwise conv over (kernel-1 previous inputs, this input).
  matvec(g.w_qkv.data(), h, C, d, s.qkv.data());
  for (std::size_t c = 0; c < C; ++c) {
    const float* taps = g.conv.data() + c * K;
    float acc = 0.0f;
    for (std::size_t j = 0; j + 1 < K; ++j) acc += taps[j] * conv_state[j * C + c];
    acc += taps[K - 1] * s.qkv[c];
    const float y = silu(acc);
    if (c < hd) {
      s.q[c] = y;
    } else if (c < 2 * hd) {
      s.k[c - hd] = y;
    } else {
      s.v[c - 2 * hd] = y;
    }
  }
  // Conv state: drop the oldest input, append this one.
  for (std::size_t j = 0; j + 2 < K; ++j)
    std::copy(conv_state + (j + 1) * C, conv_state + (j + 2) * C, conv_state + j * C);
  std::copy(s.qkv.begin(), s.qkv.end(), conv_state + (K - 2) * C);

  matvec(g.w_z.data(), h, hd, d, s.z.data());
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (std::size_t head = 0; head < H; ++head) {
    float* q = s.q.data() + head * D;
    float* k = s.k.data() + head * D;
    const float* v = s.v.data() + head * D;
    l2norm(q, D);
    l2norm(k, D);
    for (std::size_t j = 0; j < D; ++j) q[j] *= q_scale;

    const float a = dot(g.w_a.data() + head * d, h, d) + g.a_bias[head];
    const float alpha = std::exp(-std::exp(g.a_log[head]) * softplus(a));
    const float beta = sigmoid(dot(g.w_b.data() + head * d, h, d));

    // S_t = alpha S_{t-1} (I - beta k k^T) + beta v k^T
    //     = alpha S_{t-1} + beta (v - alpha S_{t-1} k) k^T;   o_t = S_t q.
    float* S = rec + head * D * D;
    float* o = s.o.data() + head * D;
    for (std::size_t i = 0; i < D; ++i) {
      float* row = S + i * D;
      const float sk = dot(row, k, D);
      const float u = beta * (v[i] - alpha * sk);
      for (std::size_t j = 0; j < D; ++j) row[j] = alpha * row[j] + u * k[j];
      o[i] = dot(row, q, D);
    }
    // Gated per-head RMSNorm on the output.
    rmsnorm(o, g.o_norm.data(), D, o);
    const float* z = s.z.data() + head * D;
    for (std::size_t i = 0; i < D; ++i) o[i] *= silu(z[i]);
  }
  matvec(g.w_o.data(), s.o.data(), d, hd, out);
}

void TinyHybridModel::attn_step(const Layer& layer, const float* h, std::size_t pos,
                                std::span<float* const> pages, Scratch& s, float* out) const {
  const AttnWeights& a = layer.attn;
  const std::size_t d = cfg_.d_model, H = cfg_.heads, D = cfg_.head_dim, Hkv = cfg_.kv_heads,
                    P = cfg_.page_size, kvd = Hkv * D, hd = H * D;
  const std::size_t group = H / Hkv;
  // Offsets in floats inside one page: [attn_layer][K|V][token_in_page][kv_head][head_dim].
  const std::size_t k_base = (a.index * 2 + 0) * P * kvd;
  const std::size_t v_base = (a.index * 2 + 1) * P * kvd;

  matvec(a.w_q.data(), h, hd, d, s.q.data());
  matvec(a.w_k.data(), h, kvd, d, s.k.data());
  matvec(a.w_v.data(), h, kvd, d, s.v.data());

  // Rotary position embedding on q and k (pairs (2i, 2i+1)).
  for (std::size_t i = 0; i < D / 2; ++i) {
    const double angle = static_cast<double>(pos) * rope_inv_freq_[i];
    const float c = static_cast<float>(std::cos(angle)), sn = static_cast<float>(std::sin(angle));
    for (std::size_t head = 0; head < H; ++head) {
      float* q = s.q.data() + head * D + 2 * i;
      const float q0 = q[0], q1 = q[1];
      q[0] = q0 * c - q1 * sn;
      q[1] = q0 * sn + q1 * c;
    }
    for (std::size_t head = 0; head < Hkv; ++head) {
      float* k = s.k.data() + head * D + 2 * i;
      const float k0 = k[0], k1 = k[1];
      k[0] = k0 * c - k1 * sn;
      k[1] = k0 * sn + k1 * c;
    }
  }

  // This token's K/V go to its page; then every position 0..pos is read back from the pages.
  float* page = pages[pos / P];
  const std::size_t slot = pos % P;
  std::copy(s.k.begin(), s.k.begin() + static_cast<std::ptrdiff_t>(kvd),
            page + k_base + slot * kvd);
  std::copy(s.v.begin(), s.v.begin() + static_cast<std::ptrdiff_t>(kvd),
            page + v_base + slot * kvd);

  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  float* scores = s.scores.data();
  for (std::size_t head = 0; head < H; ++head) {
    const std::size_t kvh = head / group;
    const float* q = s.q.data() + head * D;
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t t = 0; t <= pos; ++t) {
      const float* kt = pages[t / P] + k_base + (t % P) * kvd + kvh * D;
      const float sc = dot(q, kt, D) * scale;
      scores[t] = sc;
      m = std::max(m, sc);
    }
    float denom = 0.0f;
    float* o = s.o.data() + head * D;
    std::fill(o, o + D, 0.0f);
    for (std::size_t t = 0; t <= pos; ++t) {
      const float w = std::exp(scores[t] - m);
      denom += w;
      const float* vt = pages[t / P] + v_base + (t % P) * kvd + kvh * D;
      for (std::size_t j = 0; j < D; ++j) o[j] += w * vt[j];
    }
    const float inv = 1.0f / denom;
    for (std::size_t j = 0; j < D; ++j) o[j] *= inv;
  }
  matvec(a.w_o.data(), s.o.data(), d, hd, out);
}

}  // namespace radixtier::model
