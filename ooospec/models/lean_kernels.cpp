// The lean decoder's kernels (ooospec/models/lean_decoder.py): products that read a weight once for
// up to a few dozen rows, and the small per-row operations of a Llama / Qwen2 layer.
//
// Invariant, by construction: every output row is computed by the same sequence of floating-point
// operations whatever the number of rows beside it, and whatever the thread count. A product keeps
// one accumulator lane per (row, output) and walks the reduction in one fixed order; attention walks a
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
// products: y[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]), the outputs in vector lanes
//
// A weight is packed once into tiles of TILE outputs (4 vectors): [tiles][K / STEP][TILE][STEP], so
// a tile is one contiguous stream. For each step of STEP k values, each vector of the tile is multiplied
// with one row's STEP values broadcast to every lane and added to that (row, vector)'s accumulator:
// a lane sums its output's products in ascending k, one step at a time, whatever the rows beside it.
// bf16: a vector is 16 outputs, a step a k pair (vdpbf16ps); fp32: 8 outputs, one k (AVX2 FMA).

constexpr int VECTORS_BF16 = 2;  // vectors per tile: 2 x 12 rows of accumulators in the 32 zmm registers
constexpr int VECTORS_F32 = 4;   // 4 x 3 rows of accumulators in the 16 ymm registers
constexpr int MAX_ROWS_BF16 = 12;
constexpr int MAX_ROWS_F32 = 3;

struct Layout {
  int64_t lanes, step, vectors;  // outputs per vector, k values per step, vectors per tile
  int64_t tile() const { return vectors * lanes; }
};

Layout layout_of(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? Layout{16, 2, VECTORS_BF16} : Layout{8, 1, VECTORS_F32};
}

torch::Tensor pack(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2, "pack: a 2-D weight, got ", w.dim(), "-D");
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kFloat, "pack: bf16 or fp32 weights");
  w = w.detach().contiguous();
  const Layout lay = layout_of(w.scalar_type());
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t tiles = (N + lay.tile() - 1) / lay.tile(), steps = (K + lay.step - 1) / lay.step;
  auto padded = torch::zeros({tiles * lay.tile(), steps * lay.step}, w.options());
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(w);
  return padded.view({tiles, lay.tile(), steps, lay.step}).permute({0, 2, 1, 3}).contiguous();
}

#if defined(__AVX512BF16__)
// ROWS rows x the tile's vectors; out: [ROWS][tile] fp32 sums
template <int ROWS>
inline void rows_bf16(const uint16_t* w, int64_t steps, const uint16_t* x, int64_t x_stride, float* out) {
  constexpr int VECS = VECTORS_BF16;
  constexpr int64_t TILE = VECS * 16;
  __m512 acc[ROWS][VECS];
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < VECS; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < steps; ++p) {
    const uint16_t* wp = w + p * TILE * 2;
    for (int j = 0; j < VECS; ++j) _mm_prefetch(reinterpret_cast<const char*>(wp + 32 * TILE * 2 + j * 32), _MM_HINT_T0);
    __m512bh wv[VECS];
    for (int j = 0; j < VECS; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(wp + j * 32);
    for (int m = 0; m < ROWS; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * x_stride + 2 * p, 4);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int j = 0; j < VECS; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], wv[j], xv);
    }
  }
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < VECS; ++j) _mm512_storeu_ps(out + m * TILE + j * 16, acc[m][j]);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <int ROWS>
inline void tile_f32(const float* w, int64_t steps, const float* x, int64_t x_stride, float* out) {
  constexpr int VECTORS = VECTORS_F32;
  constexpr int64_t TILE = VECTORS * 8;
  __m256 acc[ROWS][VECTORS];
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < VECTORS; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < steps; ++k) {
    const float* wk = w + k * TILE;
    _mm_prefetch(reinterpret_cast<const char*>(wk + 16 * TILE), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wk + 16 * TILE + 16), _MM_HINT_T0);
    for (int m = 0; m < ROWS; ++m) {
      const __m256 xv = _mm256_broadcast_ss(x + m * x_stride + k);
      for (int j = 0; j < VECTORS; ++j) acc[m][j] = _mm256_fmadd_ps(_mm256_loadu_ps(wk + j * 8), xv, acc[m][j]);
    }
  }
  for (int m = 0; m < ROWS; ++m)
    for (int j = 0; j < VECTORS; ++j) _mm256_storeu_ps(out + m * TILE + j * 8, acc[m][j]);
}
#endif

// the portable path (no vector unit this file knows): the same sums lane by lane, slowly
template <typename T>
void tile_scalar(const T* w, int64_t steps, const Layout& lay, const T* x, int64_t x_stride, int rows, float* out) {
  const int64_t tile = lay.tile();
  for (int m = 0; m < rows; ++m)
    for (int64_t n = 0; n < tile; ++n) {
      float acc = 0.f;
      for (int64_t p = 0; p < steps; ++p) {
        float part = 0.f;  // a bf16 step adds its pair's two products to the sum at once
        for (int64_t i = 0; i < lay.step; ++i) {
          const T wv = w[(p * tile + n) * lay.step + i], xv = x[m * x_stride + p * lay.step + i];
          if constexpr (std::is_same_v<T, uint16_t>) part += bf16_to_f32(wv) * bf16_to_f32(xv);
          else part += wv * xv;
        }
        acc += part;
      }
      out[m * tile + n] = acc;
    }
}

// rows x one tile, in register blocks of at most MAX_ROWS_* rows
template <typename T>
void tile_rows(const T* w, int64_t steps, const Layout& lay, const T* x, int64_t x_stride, int rows, float* out) {
  if constexpr (std::is_same_v<T, uint16_t>) {
#if defined(__AVX512BF16__)
    for (int m = 0; m < rows; m += MAX_ROWS_BF16) {
      const T* xm = x + m * x_stride;
      float* om = out + m * lay.tile();
      switch (std::min(MAX_ROWS_BF16, rows - m)) {
        case 1: rows_bf16<1>(w, steps, xm, x_stride, om); break;
        case 2: rows_bf16<2>(w, steps, xm, x_stride, om); break;
        case 3: rows_bf16<3>(w, steps, xm, x_stride, om); break;
        case 4: rows_bf16<4>(w, steps, xm, x_stride, om); break;
        case 5: rows_bf16<5>(w, steps, xm, x_stride, om); break;
        case 6: rows_bf16<6>(w, steps, xm, x_stride, om); break;
        case 7: rows_bf16<7>(w, steps, xm, x_stride, om); break;
        case 8: rows_bf16<8>(w, steps, xm, x_stride, om); break;
        case 9: rows_bf16<9>(w, steps, xm, x_stride, om); break;
        case 10: rows_bf16<10>(w, steps, xm, x_stride, om); break;
        case 11: rows_bf16<11>(w, steps, xm, x_stride, om); break;
        default: rows_bf16<12>(w, steps, xm, x_stride, om); break;
      }
    }
    return;
#endif
  } else {
#if defined(__AVX2__) && defined(__FMA__)
    for (int m = 0; m < rows; m += MAX_ROWS_F32) {
      const T* xm = x + m * x_stride;
      float* om = out + m * lay.tile();
      switch (std::min(MAX_ROWS_F32, rows - m)) {
        case 1: tile_f32<1>(w, steps, xm, x_stride, om); break;
        case 2: tile_f32<2>(w, steps, xm, x_stride, om); break;
        default: tile_f32<3>(w, steps, xm, x_stride, om); break;
      }
    }
    return;
#endif
  }
  tile_scalar<T>(w, steps, lay, x, x_stride, rows, out);
}

// rows per pass over a tile: the register blocks of one pass read the tile from the cache, not memory
constexpr int ROWS_PER_PASS = 24;

template <typename T>
void linear_impl(const T* x, int64_t M, int64_t x_stride, const T* w, int64_t tiles, int64_t steps,
                 const Layout& lay, const float* bias, int64_t N, T* y) {
  const int64_t tile = lay.tile();
  // parallel over weight tiles only: a row's sums never depend on the split
  at::parallel_for(0, tiles, 4, [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(ROWS_PER_PASS * tile);
    for (int64_t t = t0; t < t1; ++t) {
      const T* wt = w + t * steps * tile * lay.step;
      for (int64_t m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
        const int rows = static_cast<int>(std::min<int64_t>(ROWS_PER_PASS, M - m0));
        tile_rows<T>(wt, steps, lay, x + m0 * x_stride, x_stride, rows, acc.data());
        const int64_t width = std::min(tile, N - t * tile);
        for (int m = 0; m < rows; ++m) {
          T* row = y + (m0 + m) * N + t * tile;
          const float* sums = acc.data() + m * tile;
          for (int64_t j = 0; j < width; ++j) {
            const float v = sums[j] + (bias ? bias[t * tile + j] : 0.f);
            if constexpr (std::is_same_v<T, uint16_t>) row[j] = f32_to_bf16(v);
            else row[j] = v;
          }
        }
      }
    }
  });
}

torch::Tensor linear(torch::Tensor x, torch::Tensor packed, int64_t N, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.scalar_type() == packed.scalar_type(), "linear: input ", x.scalar_type(), " over a ",
              packed.scalar_type(), " weight");
  const Layout lay = layout_of(x.scalar_type());
  const int64_t K = x.size(-1), tiles = packed.size(0), steps = packed.size(1), Kp = steps * lay.step;
  TORCH_CHECK(packed.size(2) == lay.tile() && packed.size(3) == lay.step && Kp - K >= 0 && Kp - K < lay.step,
              "linear: input of ", K, " features for a packed weight of ", packed.sizes());
  TORCH_CHECK(tiles * lay.tile() >= N, "linear: ", N, " outputs from a weight of ", tiles * lay.tile());
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
                          reinterpret_cast<const uint16_t*>(packed.data_ptr()), tiles, steps, lay, b, N,
                          reinterpret_cast<uint16_t*>(y.data_ptr()));
  else
    linear_impl<float>(x2.data_ptr<float>(), M, Kp, packed.data_ptr<float>(), tiles, steps, lay, b, N,
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

#if defined(__AVX512BF16__)
// 16 vectors in, their 16 lane sums out (lane b = the sum of a[b]). Every vector is summed in the same
// order, whatever slot it sits in: lanes (0+2)+(1+3) of each 128-bit quarter, then quarters (0+1)+(2+3).
inline __m512 sum16(const __m512 (&a)[16]) {
  __m512 b[8], c[4];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
    const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
    c[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  }
  const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
  const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

// scores of one bf16 query against the n listed keys, 16 keys at a time (D = 32 * CHUNKS); a block's
// short tail repeats its last key, whose extra sums are not kept
template <int CHUNKS>
inline void scores_bf16(const uint16_t* q, const uint16_t* kbase, int64_t ks_l, const int64_t* keys, int64_t n,
                        float scale, float* out) {
  __m512bh qv[CHUNKS];
  for (int c = 0; c < CHUNKS; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(q + c * 32);
  alignas(64) float block[16];
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    const int64_t width = std::min<int64_t>(16, n - t0);
    __m512 a[16];
    for (int b = 0; b < 16; ++b) {
      const uint16_t* kr = kbase + keys[t0 + std::min<int64_t>(b, width - 1)] * ks_l;
      a[b] = _mm512_setzero_ps();
      for (int c = 0; c < CHUNKS; ++c) a[b] = _mm512_dpbf16_ps(a[b], (__m512bh)_mm512_loadu_si512(kr + c * 32), qv[c]);
    }
    const __m512 sums = _mm512_mul_ps(sum16(a), _mm512_set1_ps(scale));
    if (width == 16) _mm512_storeu_ps(out + t0, sums);
    else { _mm512_store_ps(block, sums); std::memcpy(out + t0, block, width * sizeof(float)); }
  }
}
#endif

// scores of one query (scaled) against the n listed keys
template <typename T>
void scores_of(const T* q, const T* kbase, int64_t ks_l, const int64_t* keys, int64_t n, int64_t D, float scale,
               float* qf, float* out) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, uint16_t>) {
    switch (D) {
      case 32: return scores_bf16<1>(q, kbase, ks_l, keys, n, scale, out);
      case 64: return scores_bf16<2>(q, kbase, ks_l, keys, n, scale, out);
      case 128: return scores_bf16<4>(q, kbase, ks_l, keys, n, scale, out);
      default: break;
    }
  }
#endif
  for (int64_t i = 0; i < D; ++i) qf[i] = load(q, i);
  for (int64_t t = 0; t < n; ++t) out[t] = dot_row(qf, kbase + keys[t] * ks_l, D) * scale;
}

// acc[h, :] = sum over the n listed keys, ascending, of p[h, t] * v[key t, :] for each of ``heads`` heads
// (p: [heads, p_stride]); a lane's sum is the same sequence of fused multiply-adds on either path
#if defined(__AVX512F__)
// HEADS heads x VECTORS vectors of 16 lanes in registers, over every listed key
template <typename T, int VECTORS, int HEADS>
inline void weighted_values_block(const T* vbase, int64_t vs_l, const int64_t* keys, int64_t n, const float* p,
                                  int64_t p_stride, float* acc, int64_t D) {
  __m512 a[HEADS][VECTORS];
  for (int h = 0; h < HEADS; ++h)
    for (int c = 0; c < VECTORS; ++c) a[h][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const T* vr = vbase + keys[t] * vs_l;
    __m512 v[VECTORS];
    for (int c = 0; c < VECTORS; ++c) v[c] = load16(vr + c * 16);
    for (int h = 0; h < HEADS; ++h) {
      const __m512 w = _mm512_set1_ps(p[h * p_stride + t]);
      for (int c = 0; c < VECTORS; ++c) a[h][c] = _mm512_fmadd_ps(w, v[c], a[h][c]);
    }
  }
  for (int h = 0; h < HEADS; ++h)
    for (int c = 0; c < VECTORS; ++c) _mm512_storeu_ps(acc + h * D + c * 16, a[h][c]);
}

template <typename T, int VECTORS>
inline void weighted_values_vec(const T* vbase, int64_t vs_l, const int64_t* keys, int64_t n, const float* p,
                                int64_t p_stride, int64_t heads, float* acc) {
  constexpr int CHUNK = 16 / VECTORS;  // 16 accumulators of the 32 registers
  constexpr int64_t D = VECTORS * 16;
  int64_t h0 = 0;
  for (; h0 + CHUNK <= heads; h0 += CHUNK)
    weighted_values_block<T, VECTORS, CHUNK>(vbase, vs_l, keys, n, p + h0 * p_stride, p_stride, acc + h0 * D, D);
  if constexpr (CHUNK > 2)
    for (; h0 + 2 <= heads; h0 += 2)
      weighted_values_block<T, VECTORS, 2>(vbase, vs_l, keys, n, p + h0 * p_stride, p_stride, acc + h0 * D, D);
  for (; h0 < heads; ++h0)
    weighted_values_block<T, VECTORS, 1>(vbase, vs_l, keys, n, p + h0 * p_stride, p_stride, acc + h0 * D, D);
}
#endif

// acc[h, :] = sum over the n listed keys, ascending, of p[h, t] * v[key t, :] for each of ``heads`` heads
// (p: [heads, p_stride]); a lane's sum is the same sequence of fused multiply-adds on either path
template <typename T>
void weighted_values(const T* vbase, int64_t vs_l, const int64_t* keys, int64_t n, int64_t D, const float* p,
                     int64_t p_stride, int64_t heads, float* vf, float* acc) {
#if defined(__AVX512F__)
  switch (D) {
    case 32: return weighted_values_vec<T, 2>(vbase, vs_l, keys, n, p, p_stride, heads, acc);
    case 64: return weighted_values_vec<T, 4>(vbase, vs_l, keys, n, p, p_stride, heads, acc);
    case 128: return weighted_values_vec<T, 8>(vbase, vs_l, keys, n, p, p_stride, heads, acc);
    default: break;
  }
#endif
  std::fill(acc, acc + heads * D, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    const T* vr = vbase + keys[t] * vs_l;
    for (int64_t i = 0; i < D; ++i) vf[i] = load(vr, i);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < D; ++i) acc[h * D + i] = std::fma(p[h * p_stride + t], vf[i], acc[h * D + i]);
  }
}

// Attention of q [M, Hq, D] over the cache's keys and values [1, Hkv, L, D] (any strides but the last).
// Row m sees key j where visible[m, j] is true. Scores, softmax and the weighted sum in fp32, over the
// visible keys in ascending j; the output rounded once to the dtype. The query heads that share a kv
// head run together (each key read once for the group); each head's sums are its own.
torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor visible, double scale) {
  TORCH_CHECK(q.is_contiguous() && k.stride(3) == 1 && v.stride(3) == 1, "attention: rows of dim contiguous");
  TORCH_CHECK(visible.scalar_type() == at::kBool && visible.is_contiguous(), "attention: a bool mask [rows, keys]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(), "attention: one dtype");
  const int64_t M = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k.size(1), L = k.size(2);
  TORCH_CHECK(visible.size(0) == M && visible.size(1) == L, "attention: mask ", visible.sizes(), " for ", M,
              " rows and ", L, " keys");
  TORCH_CHECK(Hq % Hkv == 0, "attention: ", Hq, " query heads over ", Hkv, " kv heads");
  const int64_t group = Hq / Hkv, ks_h = k.stride(1), ks_l = k.stride(2), vs_h = v.stride(1), vs_l = v.stride(2);
  auto out = torch::empty_like(q);
  const bool* vis = visible.data_ptr<bool>();
  const float sc = static_cast<float>(scale);
  DISPATCH(q, [&] {
    const T* qp = ptr<T>(q); const T* kp = ptr<T>(k); const T* vp = ptr<T>(v); T* op = ptr<T>(out);
    at::parallel_for(0, M * Hkv, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> qf(D), acc(group * D), scores(group * L), vf(D);
      std::vector<int64_t> keys(L);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t m = b / Hkv, g = b % Hkv;
        int64_t n = 0;
        for (int64_t j = 0; j < L; ++j) if (vis[m * L + j]) keys[n++] = j;
        std::vector<float> totals(group, 0.f);
        for (int64_t h = 0; h < group; ++h) {
          float* sh = scores.data() + h * L;
          scores_of<T>(qp + (m * Hq + g * group + h) * D, kp + g * ks_h, ks_l, keys.data(), n, D, sc, qf.data(), sh);
          float best = -INFINITY;
          for (int64_t t = 0; t < n; ++t) best = std::max(best, sh[t]);
          int64_t t = 0;
#if defined(__AVX512F__)
          for (; t + 16 <= n; t += 16)
            _mm512_storeu_ps(sh + t, exp512(_mm512_sub_ps(_mm512_loadu_ps(sh + t), _mm512_set1_ps(best))));
#endif
          for (; t < n; ++t) sh[t] = exp_poly(sh[t] - best);
          for (t = 0; t < n; ++t) totals[h] += sh[t];
        }
        weighted_values<T>(vp + g * vs_h, vs_l, keys.data(), n, D, scores.data(), L, group, vf.data(), acc.data());
        for (int64_t h = 0; h < group; ++h)
          for (int64_t i = 0; i < D; ++i)
            store(op, (m * Hq + g * group + h) * D + i, n ? acc[h * D + i] / totals[h] : 0.f);
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
