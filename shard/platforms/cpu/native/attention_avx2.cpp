// The paged attention kernels' arithmetic (paged_decode.cpp, paged_prefill.cpp) with AVX2 and
// FMA, for x86-64 CPUs without AVX-512. The build targets AVX-512 only where torch's own kernels
// do; elsewhere those kernels fell back to scalar loops, which a compiler cannot vectorise
// without reordering fp32 sums: a 16-row decode step of a small MoE model spent ~18% of its time
// in decode attention on the 2-core EPYC, several times what reading the cache costs. Each
// function is the scalar loop's computation in 8-lane form (sums in fp32, in another order);
// the callers take it where avx2_ready() and the head size is a multiple of 8.
#if defined(__x86_64__) && !defined(__AVX512F__)

namespace {

// Scores of G scaled query rows qf [G, dim] against one key row k.
template <int G, typename T>
SY_AVX2 void dot_tile_avx2(const float* qf, const T* k, int64_t dim, float* out,
                           int64_t out_stride) {
  __m256 acc[G];
  SY_UNROLL
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256 kv = load8(k + d);
    SY_UNROLL
    for (int g = 0; g < G; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(qf + g * dim + d), kv, acc[g]);
  }
  SY_UNROLL
  for (int g = 0; g < G; ++g) out[g * out_stride] = sum8(acc[g]);
}

template <typename T>
void dot_rows_avx2(const float* qf, const T* k, int64_t group, int64_t dim, float* out,
                   int64_t out_stride) {
  for (int64_t g0 = 0; g0 < group; g0 += 4) {
    with_group<4>(group - g0, [&](auto g) {
      dot_tile_avx2<decltype(g)::value>(qf + g0 * dim, k, dim, out + g0 * out_stride, out_stride);
    });
  }
}

// acc[g] += w[g * w_stride] * v for every query row g of the group.
template <typename T>
SY_AVX2 void axpy_rows_avx2(const float* w, int64_t w_stride, const T* v, int64_t group,
                            int64_t dim, float* acc) {
  for (int64_t d = 0; d < dim; d += 8) {
    const __m256 vv = load8(v + d);
    for (int64_t g = 0; g < group; ++g) {
      float* a = acc + g * dim + d;
      _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_set1_ps(w[g * w_stride]), vv, _mm256_loadu_ps(a)));
    }
  }
}

// The low n of 8 lanes (n <= 8), for masked loads and stores.
SY_AVX2 inline __m256i first8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// s[i] = e^(s[i] - m) over n scores, m = max(max s, sink); returns their sum plus e^(sink - m)
// (paged_decode.cpp's softmax_numerators: sink -inf for none).
SY_AVX2 float softmax_numerators_avx2(float* s, int64_t n, float sink) {
  const int64_t body = n - n % 8;
  __m256 m8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < body; i += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + i));
  float m = std::max(max8(m8), sink);
  for (int64_t i = body; i < n; ++i) m = std::max(m, s[i]);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < body; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (body < n) {
    const __m256i tail = first8(n - body);
    const __m256 e = _mm256_and_ps(
        exp8(_mm256_sub_ps(_mm256_maskload_ps(s + body, tail), mv)), _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(s + body, tail, e);
    sum = _mm256_add_ps(sum, e);
  }
  return sum8(sum) + std::exp(sink - m);
}

// acc[r] (16 lanes: two vectors) = sum over i < count of a[r * lda + i] * b[i * ldb .. + 16),
// for R (<= 4) rows: each loaded pair of b vectors feeds all R rows.
template <int R>
SY_AVX2 inline void rows_times_16(const float* a, int64_t lda, const float* b, int64_t ldb,
                                  int64_t count, __m256 (&acc)[R][2]) {
  SY_UNROLL
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t i = 0; i < count; ++i) {
    const __m256 b0 = _mm256_loadu_ps(b + i * ldb), b1 = _mm256_loadu_ps(b + i * ldb + 8);
    SY_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_set1_ps(a[r * lda + i]);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
}

// Prefill: scores of R (<= 4) scaled query rows qf [R, dim] against one block of 16 staged keys
// (kt: [dim][16]) into s [R][n_pad] at the block's columns.
template <int R>
SY_AVX2 void score_block_avx2(const float* qf, int64_t dim, const float* kt, float* s,
                              int64_t n_pad) {
  __m256 acc[R][2];
  rows_times_16<R>(qf, dim, kt, 16, dim, acc);
  SY_UNROLL
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(s + r * n_pad, acc[r][0]);
    _mm256_storeu_ps(s + r * n_pad + 8, acc[r][1]);
  }
}

// Prefill: out[r][dc .. dc + 16) = inv[r] * sum_j p[r][j] v[j] over keys [a, e) for R (<= 4)
// rows (vf: [key][dim_pad] fp32, zero past dim), rounded once into out's type, lanes past dim
// not written.
template <int R, typename T>
SY_AVX2 void weigh_block_avx2(const float* p, int64_t n_pad, int64_t a, int64_t e,
                              const float* vf, int64_t dim_pad, int64_t dc, int64_t dim,
                              const float* inv, T* const* out) {
  __m256 acc[R][2];
  rows_times_16<R>(p + a, n_pad, vf + a * dim_pad + dc, dim_pad, e - a, acc);
  SY_UNROLL
  for (int r = 0; r < R; ++r) {
    alignas(32) float lanes[16];
    _mm256_store_ps(lanes, _mm256_mul_ps(acc[r][0], _mm256_set1_ps(inv[r])));
    _mm256_store_ps(lanes + 8, _mm256_mul_ps(acc[r][1], _mm256_set1_ps(inv[r])));
    const int64_t width = std::min<int64_t>(16, dim - dc);
    for (int64_t i = 0; i < width; ++i) out[r][dc + i] = static_cast<T>(lanes[i]);
  }
}

// Prefill: rows' scores over the staged key blocks [lo, hi) (lo a multiple of 16), four
// rows at a time.
inline void score_rows_avx2(const float* qf, int64_t rows, int64_t dim, const float* kt,
                            int64_t lo, int64_t hi, float* s, int64_t n_pad) {
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    with_group<4>(rows - r0, [&](auto r) {
      for (int64_t kb = lo / 16; kb * 16 < hi; ++kb)
        score_block_avx2<decltype(r)::value>(qf + r0 * dim, dim, kt + kb * 16 * dim,
                                             s + r0 * n_pad + kb * 16, n_pad);
    });
  }
}

// Prefill: every dim chunk of 16 of rows' weighted values, four rows at a time.
template <typename T>
void weigh_rows_avx2(const float* p, int64_t rows, int64_t n_pad, int64_t a, int64_t e,
                     const float* vf, int64_t dim_pad, int64_t dim, const float* inv,
                     T* const* out) {
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    with_group<4>(rows - r0, [&](auto r) {
      for (int64_t dc = 0; dc < dim; dc += 16)
        weigh_block_avx2<decltype(r)::value, T>(p + r0 * n_pad, n_pad, a, e, vf, dim_pad, dc,
                                                dim, inv + r0, out + r0);
    });
  }
}

}  // namespace
#endif
