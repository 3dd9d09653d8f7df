// A linear layer of a few rows (a decode step's, a verify step's) with bf16 or fp16 weights on a
// CPU that has AVX2 and FMA but no half-precision dot products (shard/platforms/cpu/matmul.py).
// There torch's half-precision GEMM runs at a few GFLOP/s whatever the row count, so its cost
// grows with the rows (a 5-row speculative verify step cost ~4x a 1-row decode step), and the
// widening path converts every weight to fp32 on each call. This kernel reads each weight row
// once, widens it in registers and multiplies it into up to 8 rows of x at a time: the weight's
// bytes, not the arithmetic, set its cost up to a dozen rows or so.
//
// Every output element is the same sum in the same order whatever the row count (8-wide fp32
// partial sums over k, a fixed reduction, then the tail), so a row's result does not depend on
// the rows beside it: greedy ids are the same in a batch of 1, of 4 or of a verify step's
// k + 1 rows.
#if defined(__x86_64__)

namespace {

constexpr int kRowTile = 8;

// out[m, n] = x[m, :] . w[n, :] for G rows of x (fp32, row stride k) and weight rows [n0, n1),
// NT weight rows at a time: each (m, n) sum is its own chain of FMAs, and a tile of G x NT of
// them keeps the FMA units busy (one chain alone waits on its previous FMA's latency), while
// each chain, so each result, is the same whatever G and NT are.
//
// The next tile's weight rows are fetched into the cache while this tile runs: a decode step's
// rows are each a few KB, too short for the hardware prefetcher to get ahead of, and at 1-4 rows
// of x the kernel waits on memory (a cold weight read at ~8 GB/s without, 11-16 GB/s with on
// the 2-core EPYC, bench/moe_cpu.py's second table; no change from 8 rows on, where the FMAs
// are the limit).
// A prefetch is a hint: past the weight's end it reads nothing and never faults.
template <int G, int NT, typename T>
__attribute__((target("avx2,fma,f16c"))) void rows_tile(const float* x, int64_t k, const T* w,
                                                        int64_t ldw, int64_t n, float* out,
                                                        int64_t ldo) {
  const int64_t body = k - k % 8;
  __m256 acc[NT][G];
  SY_UNROLL
  for (int t = 0; t < NT; ++t) {
    SY_UNROLL
    for (int g = 0; g < G; ++g) acc[t][g] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < body; i += 8) {
    if (i % 32 == 0) {  // a cache line (32 half values) of each of the next tile's rows
      SY_UNROLL
      for (int t = 0; t < NT; ++t)
        _mm_prefetch(reinterpret_cast<const char*>(w + (n + NT + t) * ldw + i), _MM_HINT_T0);
    }
    __m256 wv[NT];
    SY_UNROLL
    for (int t = 0; t < NT; ++t) wv[t] = load8(w + (n + t) * ldw + i);
    SY_UNROLL
    for (int g = 0; g < G; ++g) {
      const __m256 xv = _mm256_loadu_ps(x + g * k + i);
      SY_UNROLL
      for (int t = 0; t < NT; ++t) acc[t][g] = _mm256_fmadd_ps(wv[t], xv, acc[t][g]);
    }
  }
  SY_UNROLL
  for (int t = 0; t < NT; ++t) {
    const T* wn = w + (n + t) * ldw;
    SY_UNROLL
    for (int g = 0; g < G; ++g) {
      float s = sum8(acc[t][g]);
      for (int64_t i = body; i < k; ++i) s = std::fma(widen(wn[i]), x[g * k + i], s);
      out[g * ldo + n + t] = s;
    }
  }
}

// Weight rows [n0, n1) against G rows of x: NT = 8 / G rows at a time (8 accumulators, and each
// x load serves NT of them; a table giving G = 5 two rows ran slower on the EPYC), then one at
// a time.
template <int G, typename T>
void rows_block(const float* x, int64_t k, const T* w, int64_t ldw, int64_t n0, int64_t n1,
                float* out, int64_t ldo) {
  constexpr int NT = G >= 8 ? 1 : 8 / G;
  int64_t n = n0;
  for (; n + NT <= n1; n += NT) rows_tile<G, NT>(x, k, w, ldw, n, out, ldo);
  for (; n < n1; ++n) rows_tile<G, 1>(x, k, w, ldw, n, out, ldo);
}

// out[:, n0:n1] of out [M, N] (fp32, row stride ldo) = x [M, K] (fp32, contiguous) @ w.T, w's
// rows ldw apart: on the calling thread.
template <typename T>
void rows_range(const float* x, int64_t m, int64_t k, const T* w, int64_t ldw, int64_t n0,
                int64_t n1, float* out, int64_t ldo) {
  for (int64_t r = 0; r < m; r += kRowTile) {
    with_group<kRowTile>(m - r, [&](auto tile) {
      rows_block<decltype(tile)::value>(x + r * k, k, w, ldw, n0, n1, out + r * ldo, ldo);
    });
  }
}

// out [M, N] (fp32, row stride ldo) = x [M, K] (fp32, contiguous) @ w[:N].T, w's rows ldw apart.
// Each thread takes whole weight rows, every row of x for each (the weight is read once).
template <typename T>
void rows_gemm(const float* x, int64_t m, int64_t k, const T* w, int64_t ldw, int64_t n,
               float* out, int64_t ldo) {
  const int64_t grain = std::max<int64_t>(16, 4096 / std::max<int64_t>(k / 64, 1));
  at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) {
    rows_range(x, m, k, w, ldw, n0, n1, out, ldo);
  });
}

template <typename F>
void with_half_dtype(const torch::Tensor& w, const char* name, F&& f) {
  if (w.scalar_type() == at::kBFloat16) {
    f(c10::BFloat16{});
  } else {
    TORCH_CHECK(w.scalar_type() == at::kHalf, name, ": the weights must be bf16 or fp16");
    f(c10::Half{});
  }
}

}  // namespace

// x [M, K] (any float dtype), w [N, K] bf16 or fp16 with contiguous rows, bias [N] | None ->
// [M, N] in x's dtype: x @ w.T + bias, accumulated in fp32 and rounded once (as torch's
// half-precision linear rounds its fp32 sums). Only on a CPU with AVX2 and FMA (the caller checks).
torch::Tensor rows_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
              "rows_linear: x must be [M, K] and w [N, K]");
  TORCH_CHECK(w.stride(1) == 1, "rows_linear: the weight's rows must be contiguous");
  const auto xf = x.to(at::kFloat).contiguous();
  const int64_t m = xf.size(0), k = xf.size(1), n = w.size(0);
  auto out = torch::empty({m, n}, xf.options());
  with_half_dtype(w, "rows_linear", [&](auto zero) {
    using T = decltype(zero);
    rows_gemm(xf.data_ptr<float>(), m, k, reinterpret_cast<const T*>(w.data_ptr()), w.stride(0),
              n, out.data_ptr<float>(), n);
  });
  if (bias.has_value()) out.add_(bias->to(at::kFloat));
  return out.to(x.scalar_type());
}

#else
torch::Tensor rows_linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(false, "rows_linear: built only for x86-64 (AVX2 and FMA)");
}
#endif
