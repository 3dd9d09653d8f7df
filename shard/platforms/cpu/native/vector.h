// What every native CPU kernel here shares (build.py compiles this first, then the kernels'
// sources, as one extension): the headers, and 16-wide loads and stores that widen a row's
// fp32, bf16 or fp16 values to fp32 and round fp32 sums back (to nearest even, as torch does).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// Register tiles are arrays of vectors indexed by small constant loops: unrolled whole, they
// live in registers. Left as loops, GCC 12 -O3 may keep a tile on the stack and store every
// accumulator at each step of the loop around it (it did in lora.cpp's expand: a third of the
// kernel's speed). Put before every loop over a tile's constant dimensions.
#define SY_UNROLL _Pragma("GCC unroll 16")

namespace {

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float widen(c10::Half x) { return static_cast<float>(x); }

// Calls f(std::integral_constant<int, G>) with G = min(left, kMax) (kMax <= 8): a register
// tile's row count (query heads, tokens) as a compile-time constant.
template <int kMax, typename F>
inline void with_group(int64_t left, F&& f) {
  switch (std::min<int64_t>(kMax, left)) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, (kMax < 2 ? kMax : 2)>{}); break;
    case 3: f(std::integral_constant<int, (kMax < 3 ? kMax : 3)>{}); break;
    case 4: f(std::integral_constant<int, (kMax < 4 ? kMax : 4)>{}); break;
    case 5: f(std::integral_constant<int, (kMax < 5 ? kMax : 5)>{}); break;
    case 6: f(std::integral_constant<int, (kMax < 6 ? kMax : 6)>{}); break;
    case 7: f(std::integral_constant<int, (kMax < 7 ? kMax : 7)>{}); break;
    default: f(std::integral_constant<int, kMax>{}); break;
  }
}

// Calls f(T{}) with T the C++ type of `type` (float, c10::BFloat16, c10::Half); any other dtype
// is an error naming the kernel (`what`).
template <typename F>
inline void with_dtype(at::ScalarType type, const char* what, F&& f) {
  switch (type) {
    case at::kFloat: f(float{}); break;
    case at::kBFloat16: f(c10::BFloat16{}); break;
    case at::kHalf: f(c10::Half{}); break;
    default: TORCH_CHECK(false, what, ": float32, bfloat16 or float16, not ", type);
  }
}

// v rounded to T's precision (to nearest even, as a cast to T rounds) and widened back: where
// torch rounds an intermediate to the tensor's dtype, so do the kernels.
template <typename T>
inline float round_to(float v) { return widen(static_cast<T>(v)); }
template <>
inline float round_to<float>(float v) { return v; }

#if defined(__AVX512F__)
inline __mmask16 first_lanes(int64_t n) {  // the low n of 16 lanes (n <= 16)
  return static_cast<__mmask16>((1u << n) - 1);
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The first n values (n < 16); the other lanes are zero and nothing past p[n - 1] is read.
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const c10::BFloat16* p, __mmask16 m) {
  __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const c10::Half* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

// v into the lanes of m at p, rounded to p's type; nothing else is written.
inline void store16(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
// v's 16 values rounded to bf16 (to nearest even, on the bits: no AVX512-BF16 needed; NaN stays
// a quiet NaN), as 16-bit lanes.
inline __m256i bf16_bits_exact(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  rounded = _mm512_srli_epi32(rounded, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(rounded);
}
// The same bits, faster where the CPU has AVX512-BF16: vcvtneps2bf16 rounds to nearest even in
// one instruction (the integer sequence above is ~10 and was a third of the SwiGLU tile
// epilogue), but reads denormal inputs as zero and keeps NaN payloads; the rare vectors with
// such a lane take the integer path, so every kernel's output is the same bit for bit.
inline __m256i bf16_bits(__m512 v) {
#if defined(__AVX512BF16__)
  constexpr int kNaNOrDenormal = 0x01 | 0x80 | 0x20;  // fpclass: quiet NaN, signalling NaN, denormal
  if (!_mm512_fpclass_ps_mask(v, kNaNOrDenormal)) return (__m256i)_mm512_cvtneps_pbh(v);
#endif
  return bf16_bits_exact(v);
}
inline void store16(c10::BFloat16* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, bf16_bits(v));
}
inline void store16(c10::Half* p, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// e^x for 16 lanes: 2^k e^r with k = round(x / ln 2) and |r| <= ln(2) / 2 (ln 2 split in two
// parts so that r keeps its bits), e^r by its Taylor polynomial to degree 7 (truncation under
// 0.1 ulp of fp32 there). x is clamped to where fp32's e^x is neither infinite nor zero; scalef
// then gives +inf above and denormals or 0 below, as libm does. The decode kernel's softmax and
// SiLU use it.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.8f)), _mm512_set1_ps(-104.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040);
  for (const float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(p, k);
}

// round_to for 16 lanes.
template <typename T>
inline __m512 round_to(__m512 v);
template <>
inline __m512 round_to<float>(__m512 v) { return v; }
template <>
inline __m512 round_to<c10::BFloat16>(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_bits(v)), 16));
}
template <>
inline __m512 round_to<c10::Half>(__m512 v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// SwiGLU's product for 16 lanes of a gate g and an up u already in T's precision:
// round(g / (1 + e^-g)) * u, left for the caller's store to round (silu_mul in elementwise.cpp
// and the tile kernel's gated epilogue both compute it here, so they agree bit for bit).
template <typename T>
inline __m512 silu_times16(__m512 g, __m512 u) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(round_to<T>(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e))), u);
}
#endif

#if defined(__x86_64__)
// AVX2 with FMA and F16C, for kernels with a path for x86-64 CPUs without AVX-512 (the build
// targets no ISA past torch's: such functions carry the target themselves, and their callers
// check avx2_ready() first). SWITCHYARD_CPU_AVX2=0 (build.py's AVX2_ENV) turns those paths off,
// read once a process: how the tests reach the scalar paths of CPUs without AVX2.
#define SY_AVX2 __attribute__((target("avx2,fma,f16c")))

inline bool avx2_ready() {
  static const bool ready = [] {
    const char* setting = std::getenv("SWITCHYARD_CPU_AVX2");
    return !(setting != nullptr && std::string(setting) == "0") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return ready;
}

// 8 values at p widened to fp32.
SY_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
SY_AVX2 inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
SY_AVX2 inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

SY_AVX2 inline float sum8(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

SY_AVX2 inline float max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// e^x for x <= 0 (softmax numerators), within ~2 ulp of std::exp: x = n ln2 + r, |r| <= ln2 / 2,
// e^r by Cephes' expf polynomial, times 2^n. Below -87 (e^x < 2^-125) it returns ~1.6e-38, which
// no fp32 sum of numerators (the largest is 1) can tell from 0.
SY_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i scale = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(scale));
}
#endif

}  // namespace
