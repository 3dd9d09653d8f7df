// The greedy choice of each row of fp32 scores (shard/sampling/sampler.py), as torch.argmax
// computes it: the first index of the largest value, where a NaN counts as larger than any
// number (so the first NaN wins). One pass for the maximum, then a scan for its first index,
// which is near the row's start as often as anywhere: torch's CPU argmax over a 16 x 49,152
// step took ~0.6 ms, this ~0.1 ms.
namespace {

int64_t first_nan(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(x[i])) return i;
  return -1;
}

int64_t argmax_row(const float* x, int64_t n) {
  if (n == 0) return 0;
#if defined(__AVX512F__)
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 best = lowest;
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(std::min<int64_t>(16, n - i));
    const __m512 v = _mm512_mask_loadu_ps(lowest, m, x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    best = _mm512_max_ps(best, v);
  }
  if (nan) return first_nan(x, n);
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(best));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(std::min<int64_t>(16, n - i));
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, x + i), top, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  return 0;  // not reached: the maximum is one of the row's values
#else
  const int64_t at_nan = first_nan(x, n);
  if (at_nan >= 0) return at_nan;
  int64_t arg = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[arg]) arg = i;
  return arg;
#endif
}

}  // namespace

// scores [R, V] float32 (rows contiguous, any row stride) -> [R] int64, torch.argmax(scores, 1).
torch::Tensor argmax_rows(torch::Tensor scores) {
  TORCH_CHECK(scores.dim() == 2 && scores.stride(1) == 1 && scores.size(1) > 0,
              "argmax_rows: scores must be [R, V] with V > 0 and contiguous rows");
  TORCH_CHECK(scores.scalar_type() == at::kFloat, "argmax_rows: scores must be float32");
  auto out = torch::empty({scores.size(0)}, scores.options().dtype(at::kLong));
  const float* x = scores.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  const int64_t n = scores.size(1), stride = scores.stride(0);
  at::parallel_for(0, scores.size(0), std::max<int64_t>(1, 16384 / n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) o[r] = argmax_row(x + r * stride, n);
  });
  return out;
}
