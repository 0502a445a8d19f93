// The lean decoder's kernels (ooospec/models/lean_decoder.py): products that read a weight once for
// up to a few dozen rows, and the small per-row operations of a Llama / Qwen2 layer.
//
// Invariant, by construction: every output row is computed by the same sequence of floating-point
// operations whatever the number of rows beside it, and whatever the thread count. A product keeps
// one accumulator per (row, output) and walks the reduction in one fixed order; attention walks a
// row's visible keys in ascending position. So a tree forward gives each row the bits AR's one-row
// step gives it, and a prefill in chunks the bits of a prefill in one piece.
//
// Arithmetic: bf16 (inputs, weights and outputs bf16, every sum in fp32) or fp32. Elementwise
// operations round where transformers' bf16 modules round (RMS norm, RoPE, SiLU * up), so the
// forward stays within bf16 rounding of transformers' (a test holds it there).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int TILE_N = 4;    // outputs per weight tile: each tile streams once from memory
constexpr int MAX_ROWS = 6;  // rows per register block: TILE_N x MAX_ROWS accumulators
constexpr int64_t CHUNK_BF16 = 32;  // k values per bf16 step (one 512-bit register)
constexpr int64_t CHUNK_F32 = 8;    // k values per fp32 step (one 256-bit register)

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as torch's cast
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// exp by range reduction and Cephes' degree-6 polynomial (within 2 ulp of expf); the vector form does
// the same operations lane by lane, so a value's exp does not depend on the lane it falls in
constexpr float EXP_HI = 88.3762626647949f, EXP_LO = -87.3365447505531f;
constexpr float LOG2E = 1.44269504088896341f, LN2_HI = 0.693359375f, LN2_LO = -2.12194440e-4f;
constexpr float EXP_P[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                            4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};

inline float exp_poly(float x) {
  x = std::min(std::max(x, EXP_LO), EXP_HI);
  const float n = std::nearbyint(x * LOG2E);
  const float r = std::fma(-n, LN2_LO, std::fma(-n, LN2_HI, x));
  float p = EXP_P[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, EXP_P[i]);
  p = std::fma(p, r * r, r) + 1.f;
  return std::ldexp(p, static_cast<int>(n));
}

#if defined(__AVX512F__)
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x));
  __m512 p = _mm512_set1_ps(EXP_P[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P[i]));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// 16 values of the dtype as fp32
inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
#endif

// ---------------------------------------------------------------------------------------------
// products: y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]), weights packed into tiles of TILE_N outputs

int64_t chunk_of(at::ScalarType dtype) { return dtype == at::kBFloat16 ? CHUNK_BF16 : CHUNK_F32; }

// [N/TILE_N tiles][K/chunk chunks][TILE_N outputs][chunk]: one tile is one contiguous stream
torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2, "pack: a 2-D weight, got ", w.dim(), "-D");
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kFloat, "pack: bf16 or fp32 weights");
  w = w.detach().contiguous();
  const int64_t N = w.size(0), K = w.size(1), chunk = chunk_of(w.scalar_type());
  const int64_t tiles = (N + TILE_N - 1) / TILE_N, chunks = (K + chunk - 1) / chunk;
  auto padded = torch::zeros({tiles * TILE_N, chunks * chunk}, w.options());
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(w);
  return padded.view({tiles, TILE_N, chunks, chunk}).permute({0, 2, 1, 3}).contiguous();
}

#if defined(__AVX512BF16__)
template <int ROWS>
inline void tile_bf16(const uint16_t* w, int64_t chunks, const uint16_t* x, int64_t x_stride, float* out) {
  __m512 acc[ROWS][TILE_N];
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < TILE_N; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const uint16_t* wc = w + c * TILE_N * CHUNK_BF16;
    _mm_prefetch(reinterpret_cast<const char*>(wc + 16 * TILE_N * CHUNK_BF16), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wc + 16 * TILE_N * CHUNK_BF16 + 32), _MM_HINT_T0);
    __m512bh wv[TILE_N];
    for (int j = 0; j < TILE_N; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(wc + j * CHUNK_BF16);
    for (int m = 0; m < ROWS; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * x_stride + c * CHUNK_BF16);
      for (int j = 0; j < TILE_N; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], wv[j], xv);
    }
  }
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < TILE_N; ++j) out[m * TILE_N + j] = _mm512_reduce_add_ps(acc[m][j]);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int ROWS>
inline void tile_f32(const float* w, int64_t chunks, const float* x, int64_t x_stride, float* out) {
  // 16 ymm registers on AVX2: ROWS <= 2 keeps TILE_N * ROWS accumulators, the tile and a row in them
  __m256 acc[ROWS][TILE_N];
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < TILE_N; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const float* wc = w + c * TILE_N * CHUNK_F32;
    _mm_prefetch(reinterpret_cast<const char*>(wc + 16 * TILE_N * CHUNK_F32), _MM_HINT_T0);
    __m256 wv[TILE_N];
    for (int j = 0; j < TILE_N; ++j) wv[j] = _mm256_loadu_ps(wc + j * CHUNK_F32);
    for (int m = 0; m < ROWS; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * x_stride + c * CHUNK_F32);
      for (int j = 0; j < TILE_N; ++j) acc[m][j] = _mm256_fmadd_ps(wv[j], xv, acc[m][j]);
    }
  }
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < TILE_N; ++j) out[m * TILE_N + j] = hsum256(acc[m][j]);
}
#endif

// the portable path (no vector unit this file knows): correct, slow; `fast()` says which runs
template <typename T>
void tile_scalar(const T* w, int64_t chunks, int64_t chunk, const T* x, int64_t x_stride, int rows, float* out) {
  for (int m = 0; m < rows; ++m)
    for (int j = 0; j < TILE_N; ++j) {
      float acc = 0.f;
      for (int64_t c = 0; c < chunks; ++c)
        for (int64_t i = 0; i < chunk; ++i) {
          const T wv = w[(c * TILE_N + j) * chunk + i], xv = x[m * x_stride + c * chunk + i];
          if constexpr (std::is_same_v<T, uint16_t>) acc += bf16_to_f32(wv) * bf16_to_f32(xv);
          else acc += wv * xv;
        }
      out[m * TILE_N + j] = acc;
    }
}

template <typename T>
void tile_rows(const T* w, int64_t chunks, const T* x, int64_t x_stride, int rows, float* out) {
  if constexpr (std::is_same_v<T, uint16_t>) {
#if defined(__AVX512BF16__)
    switch (rows) {
      case 1: return tile_bf16<1>(w, chunks, x, x_stride, out);
      case 2: return tile_bf16<2>(w, chunks, x, x_stride, out);
      case 3: return tile_bf16<3>(w, chunks, x, x_stride, out);
      case 4: return tile_bf16<4>(w, chunks, x, x_stride, out);
      case 5: return tile_bf16<5>(w, chunks, x, x_stride, out);
      default: return tile_bf16<6>(w, chunks, x, x_stride, out);
    }
#else
    return tile_scalar<uint16_t>(w, chunks, CHUNK_BF16, x, x_stride, rows, out);
#endif
  } else {
#if defined(__AVX2__) && defined(__FMA__)
    for (int m = 0; m < rows; m += 2) {
      if (rows - m >= 2) tile_f32<2>(w, chunks, x + m * x_stride, x_stride, out + m * TILE_N);
      else tile_f32<1>(w, chunks, x + m * x_stride, x_stride, out + m * TILE_N);
    }
#else
    tile_scalar<float>(w, chunks, CHUNK_F32, x, x_stride, rows, out);
#endif
  }
}

template <typename T>
void linear_impl(const T* x, int64_t M, int64_t x_stride, const T* w, int64_t tiles, int64_t chunks,
                 const float* bias, int64_t N, T* y) {
  // parallel over weight tiles only: a row's sums never depend on the split
  at::parallel_for(0, tiles, 8, [&](int64_t t0, int64_t t1) {
    float acc[MAX_ROWS * TILE_N];
    for (int64_t t = t0; t < t1; ++t) {
      const T* wt = w + t * chunks * TILE_N * chunk_of(std::is_same_v<T, uint16_t> ? at::kBFloat16 : at::kFloat);
      for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS) {
        const int rows = static_cast<int>(std::min<int64_t>(MAX_ROWS, M - m0));
        tile_rows<T>(wt, chunks, x + m0 * x_stride, x_stride, rows, acc);
        for (int m = 0; m < rows; ++m)
          for (int j = 0; j < TILE_N; ++j) {
            const int64_t n = t * TILE_N + j;
            if (n >= N) break;
            const float v = acc[m * TILE_N + j] + (bias ? bias[n] : 0.f);
            if constexpr (std::is_same_v<T, uint16_t>) y[(m0 + m) * N + n] = f32_to_bf16(v);
            else y[(m0 + m) * N + n] = v;
          }
      }
    }
  });
}

torch::Tensor linear(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == packed.scalar_type(), "linear: input ", x.scalar_type(), " over a ",
              packed.scalar_type(), " weight");
  const int64_t K = x.size(-1), tiles = packed.size(0), chunks = packed.size(1), Kp = chunks * packed.size(3);
  TORCH_CHECK(Kp - K >= 0 && Kp - K < packed.size(3), "linear: input of ", K, " features for a weight of ", Kp);
  auto shape = x.sizes().vec();
  auto x2 = x.reshape({-1, K});
  if (Kp != K) x2 = torch::constant_pad_nd(x2, {0, Kp - K});
  x2 = x2.contiguous();
  const int64_t M = x2.size(0);
  auto y = torch::empty({M, N}, x.options());
  torch::Tensor bias_f;
  if (bias.has_value() && bias->defined()) bias_f = bias->to(at::kFloat).contiguous();
  const float* b = bias_f.defined() ? bias_f.data_ptr<float>() : nullptr;
  if (x.scalar_type() == at::kBFloat16)
    linear_impl<uint16_t>(reinterpret_cast<const uint16_t*>(x2.data_ptr()), M, Kp,
                          reinterpret_cast<const uint16_t*>(packed.data_ptr()), tiles, chunks, b, N,
                          reinterpret_cast<uint16_t*>(y.data_ptr()));
  else
    linear_impl<float>(x2.data_ptr<float>(), M, Kp, packed.data_ptr<float>(), tiles, chunks, b, N,
                       y.data_ptr<float>());
  shape.back() = N;
  return y.view(shape);
}

// ---------------------------------------------------------------------------------------------
// per-row operations, in transformers' rounding

template <typename T> inline float load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, uint16_t>) return bf16_to_f32(p[i]);
  else return p[i];
}
template <typename T> inline void store(T* p, int64_t i, float v) {
  if constexpr (std::is_same_v<T, uint16_t>) p[i] = f32_to_bf16(v);
  else p[i] = v;
}
template <typename T> inline float rnd(float v) {
  if constexpr (std::is_same_v<T, uint16_t>) return round_bf16(v);
  else return v;
}

#define DISPATCH(tensor, ...)                                                      \
  if ((tensor).scalar_type() == at::kBFloat16) {                                   \
    using T = uint16_t;                                                            \
    __VA_ARGS__();                                                                 \
  } else {                                                                         \
    TORCH_CHECK((tensor).scalar_type() == at::kFloat, "bf16 or fp32 tensors only"); \
    using T = float;                                                               \
    __VA_ARGS__();                                                                 \
  }

template <typename T> T* ptr(torch::Tensor& t) { return reinterpret_cast<T*>(t.data_ptr()); }

// weight * (x / rms(x)): the sum of squares in fp32 in index order, the normalised row rounded to the
// model's dtype before the weight's product (transformers' LlamaRMSNorm / Qwen2RMSNorm)
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  x = x.contiguous();
  const int64_t D = x.size(-1), M = x.numel() / D;
  auto y = torch::empty_like(x);
  auto w = weight.contiguous();
  DISPATCH(x, [&] {
    const T* xp = ptr<T>(x); const T* wp = ptr<T>(w); T* yp = ptr<T>(y);
    for (int64_t m = 0; m < M; ++m) {
      float ss = 0.f;
      for (int64_t i = 0; i < D; ++i) { const float v = load(xp, m * D + i); ss += v * v; }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(D) + static_cast<float>(eps));
      for (int64_t i = 0; i < D; ++i)
        store(yp, m * D + i, load(wp, i) * rnd<T>(load(xp, m * D + i) * inv));
    }
  });
  return y;
}

// RoPE in place on x [M, heads, D] with cos / sin [M, D] already in the model's dtype:
// x * cos + rotate_half(x) * sin, each product and the sum rounded as transformers' bf16 ops round
void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.is_contiguous(), "rope_: a contiguous [rows, heads, dim] tensor");
  const int64_t M = x.size(0), H = x.size(1), D = x.size(2), half = D / 2;
  auto c = cos.contiguous(), s = sin.contiguous();
  DISPATCH(x, [&] {
    T* xp = ptr<T>(x); const T* cp = ptr<T>(c); const T* sp = ptr<T>(s);
    std::vector<float> row(D);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t h = 0; h < H; ++h) {
        T* xr = xp + (m * H + h) * D;
        for (int64_t i = 0; i < D; ++i) row[i] = load(xr, i);
        for (int64_t i = 0; i < D; ++i) {
          const float rotated = i < half ? -row[i + half] : row[i - half];
          const float a = rnd<T>(row[i] * load(cp, m * D + i)), b = rnd<T>(rotated * load(sp, m * D + i));
          store(xr, i, a + b);
        }
      }
  });
}

// silu(gate) * up for gate_up [M, 2I] (gate first): silu rounded to the dtype, then the product
torch::Tensor silu_mul(torch::Tensor gate_up) {
  gate_up = gate_up.contiguous();
  const int64_t I = gate_up.size(-1) / 2, M = gate_up.numel() / (2 * I);
  auto shape = gate_up.sizes().vec();
  shape.back() = I;
  auto y = torch::empty(shape, gate_up.options());
  DISPATCH(gate_up, [&] {
    const T* g = ptr<T>(gate_up); T* yp = ptr<T>(y);
    for (int64_t m = 0; m < M; ++m) {
      const T* gr = g + m * 2 * I; const T* ur = gr + I; T* yr = yp + m * I;
      int64_t i = 0;
#if defined(__AVX512F__)
      alignas(64) float sv[16];
      for (; i + 16 <= I; i += 16) {  // the same operations as the scalar tail, 16 lanes at once
        const __m512 gv = load16(gr + i);
        _mm512_store_ps(sv, _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv)))));
        for (int l = 0; l < 16; ++l) store(yr, i + l, rnd<T>(sv[l]) * load(ur, i + l));
      }
#endif
      for (; i < I; ++i) {
        const float gv = load(gr, i);
        store(yr, i, rnd<T>(gv / (1.f + exp_poly(-gv))) * load(ur, i));
      }
    }
  });
  return y;
}

// q . k over D values in fp32: 16 lanes summed in one fixed order, or the scalar loop (same order
// for every row: which one runs depends on D and the build only)
template <typename T> inline float dot_row(const float* q, const T* k, int64_t D) {
#if defined(__AVX512F__)
  if (D % 16 == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < D; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16(k + i), acc);
    return _mm512_reduce_add_ps(acc);
  }
#endif
  float s = 0.f;
  for (int64_t i = 0; i < D; ++i) s = std::fma(q[i], load(k, i), s);
  return s;
}

template <typename T> inline void axpy_row(float p, const T* v, float* acc, int64_t D) {
#if defined(__AVX512F__)
  if (D % 16 == 0) {
    const __m512 pv = _mm512_set1_ps(p);
    for (int64_t i = 0; i < D; i += 16)
      _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(pv, load16(v + i), _mm512_loadu_ps(acc + i)));
    return;
  }
#endif
  for (int64_t i = 0; i < D; ++i) acc[i] = std::fma(p, load(v, i), acc[i]);
}

// Attention of q [M, Hq, D] over the cache's keys and values [1, Hkv, L, D] (any strides but the last).
// Row m sees key j where visible[m, j] is true. Scores, softmax and the weighted sum in fp32, over the
// visible keys in ascending j; the output rounded once to the dtype. Grouped heads share a kv head.
torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor visible, double scale) {
  TORCH_CHECK(q.is_contiguous() && k.stride(3) == 1 && v.stride(3) == 1, "attention: rows of dim contiguous");
  TORCH_CHECK(visible.scalar_type() == at::kBool && visible.is_contiguous(), "attention: a bool mask [rows, keys]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), "attention: one dtype");
  const int64_t M = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k.size(1), L = k.size(2);
  TORCH_CHECK(visible.size(0) == M && visible.size(1) == L, "attention: mask ", visible.sizes(), " for ", M,
              " rows and ", L, " keys");
  const int64_t group = Hq / Hkv, ks_h = k.stride(1), ks_l = k.stride(2), vs_h = v.stride(1), vs_l = v.stride(2);
  auto out = torch::empty_like(q);
  const bool* vis = visible.data_ptr<bool>();
  const float sc = static_cast<float>(scale);
  DISPATCH(q, [&] {
    const T* qp = ptr<T>(q); const T* kp = ptr<T>(k); const T* vp = ptr<T>(v); T* op = ptr<T>(out);
    at::parallel_for(0, M * Hq, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> qf(D), acc(D), scores(L);
      std::vector<int64_t> keys(L);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t m = b / Hq, h = b % Hq, g = h / group;
        int64_t n = 0;
        for (int64_t j = 0; j < L; ++j) if (vis[m * L + j]) keys[n++] = j;
        for (int64_t i = 0; i < D; ++i) qf[i] = load(qp, (m * Hq + h) * D + i);
        float best = -INFINITY;
        for (int64_t t = 0; t < n; ++t) {
          scores[t] = dot_row(qf.data(), kp + g * ks_h + keys[t] * ks_l, D) * sc;
          best = std::max(best, scores[t]);
        }
        float total = 0.f;
        int64_t t = 0;
#if defined(__AVX512F__)
        for (; t + 16 <= n; t += 16)
          _mm512_storeu_ps(scores.data() + t, exp512(_mm512_sub_ps(_mm512_loadu_ps(scores.data() + t), _mm512_set1_ps(best))));
#endif
        for (; t < n; ++t) scores[t] = exp_poly(scores[t] - best);
        std::fill(acc.begin(), acc.end(), 0.f);
        for (t = 0; t < n; ++t) {
          total += scores[t];
          axpy_row(scores[t], vp + g * vs_h + keys[t] * vs_l, acc.data(), D);
        }
        for (int64_t i = 0; i < D; ++i) store(op, (m * Hq + h) * D + i, n ? acc[i] / total : 0.f);
      }
    });
  });
  return out;
}

// which instructions the products run on here: "avx512_bf16", "avx2" or "portable" per dtype
std::string products(const std::string& dtype) {
  if (dtype == "bfloat16") {
#if defined(__AVX512BF16__)
    return "avx512_bf16";
#else
    return "portable";
#endif
  }
#if defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "portable";
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "a weight [N, K] in the product's tiles");
  m.def("linear", &linear, "x @ w.T (+ bias) on a packed weight, rows independent");
  m.def("rms_norm", &rms_norm);
  m.def("rope_", &rope_);
  m.def("silu_mul", &silu_mul);
  m.def("attention", &attention);
  m.def("products", &products);
}
