// Paged decode attention on the CPU (shard/native/build.py builds it): one query row
// per sequence against its cached K/V, read in place through the block table, with scores
// (optionally soft-capped, Gemma 2), softmax and sums in fp32. The torch path
// (torch_backend.py) first gathers every row's K/V
// into a padded copy for SDPA: three passes over the cache's bytes where this makes one, and
// ~1,000 small torch calls a step fewer. Positions past a row's context (or before its window)
// are never read, so no other sequence's stale slot can reach its sums.
//
// AVX-512 where the build targets it (build.py asks for it when torch's own CPU kernels
// run AVX-512 here), AVX2 on other x86-64 CPUs that have it (attention_avx2.cpp), with a plain
// scalar path for any other CPU, head size or group size.
namespace {

#if defined(__AVX512F__)
constexpr int64_t kMaxGroup = 16;  // query heads per KV head held in registers

#endif

constexpr float kNoSink = -std::numeric_limits<float>::infinity();

// s[i] = e^(s[i] - m) over n scores, m = max(max s, sink); returns their sum plus e^(sink - m):
// the softmax denominator with an attention sink (gpt-oss: a logit without a value; kNoSink,
// whose term is 0, for none), as transformers takes it, a last column of the scores.
inline float softmax_numerators(float* s, int64_t n, float sink = kNoSink) {
#if defined(__AVX512F__)
  __m512 m16 = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m16 = _mm512_max_ps(m16, _mm512_loadu_ps(s + i));
  float m = std::max(_mm512_reduce_max_ps(m16), sink);
  for (; i < n; ++i) m = std::max(m, s[i]);
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum16 = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv));
    _mm512_storeu_ps(s + i, e);
    sum16 = _mm512_add_ps(sum16, e);
  }
  if (i < n) {
    const __mmask16 tail = first_lanes(n - i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + i), mv));
    _mm512_mask_storeu_ps(s + i, tail, e);
    sum16 = _mm512_add_ps(sum16, _mm512_maskz_mov_ps(tail, e));
  }
  return _mm512_reduce_add_ps(sum16) + std::exp(sink - m);
#else
#if defined(__x86_64__)
  if (avx2_ready()) return softmax_numerators_avx2(s, n, sink);
#endif
  float m = sink;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, s[i]);
  float sum = std::exp(sink - m);
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  return sum;
#endif
}

// Attention-logit soft-capping (Gemma 2) over n scaled scores, in place: s = cap * tanh(s / cap),
// before any mask or softmax sees them. Every kernel here calls it once per row of scores, and
// only where cap > 0: an uncapped model pays one test a row, never one a score.
inline void soft_cap(float* s, int64_t n, float cap) {
#if defined(__AVX512F__)
  // tanh(x) = 1 - 2 / (e^(2x) + 1): exp16 saturates to +inf and 0 at the ends, so a score far
  // past the cap comes out as exactly +-cap; near 0 the error is an ulp of 1 (times cap).
  const __m512 two_over_cap = _mm512_set1_ps(2.f / cap), capv = _mm512_set1_ps(cap);
  const __m512 one = _mm512_set1_ps(1.f), two = _mm512_set1_ps(2.f);
  const auto capped = [&](__m512 x) {
    const __m512 e = exp16(_mm512_mul_ps(x, two_over_cap));
    return _mm512_mul_ps(capv, _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(e, one))));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, capped(_mm512_loadu_ps(s + i)));
  if (i < n) {
    const __mmask16 tail = first_lanes(n - i);
    _mm512_mask_storeu_ps(s + i, tail, capped(_mm512_maskz_loadu_ps(tail, s + i)));
  }
#else
  for (int64_t i = 0; i < n; ++i) s[i] = cap * std::tanh(s[i] / cap);
#endif
}

// ALiBi (BLOOM, MPT) over n scores of keys at positions first .. first + n - 1 for the query at
// `query`, in place: s[i] += slope * (first + i - query), after any cap and before the softmax.
// Called only for a model with slopes: others pay one pointer test a row.
inline void add_alibi(float* s, int64_t n, float slope, int64_t first, int64_t query) {
  const int64_t from = first - query;
  for (int64_t i = 0; i < n; ++i) s[i] += slope * float(from + i);
}

// Scores of `group` scaled query rows qf [group, dim] against one key row.
template <typename T>
inline void dot_rows(const float* qf, const T* k, int64_t group, int64_t dim, float* out,
                     int64_t out_stride) {
#if defined(__AVX512F__)
  if (dim % 16 == 0 && group <= kMaxGroup) {
    __m512 acc[kMaxGroup];
    for (int64_t g = 0; g < group; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; d += 16) {
      const __m512 kv = load16(k + d);
      for (int64_t g = 0; g < group; ++g)
        acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(qf + g * dim + d), kv, acc[g]);
    }
    for (int64_t g = 0; g < group; ++g) out[g * out_stride] = _mm512_reduce_add_ps(acc[g]);
    return;
  }
#elif defined(__x86_64__)
  if (dim % 8 == 0 && avx2_ready()) return dot_rows_avx2(qf, k, group, dim, out, out_stride);
#endif
  for (int64_t g = 0; g < group; ++g) {
    float s = 0.f;
    for (int64_t d = 0; d < dim; ++d) s += qf[g * dim + d] * widen(k[d]);
    out[g * out_stride] = s;
  }
}

// acc[g] += w[g * w_stride] * v for every query row g of the group.
template <typename T>
inline void axpy_rows(const float* w, int64_t w_stride, const T* v, int64_t group, int64_t dim,
                      float* acc) {
#if defined(__AVX512F__)
  if (dim % 16 == 0) {
    for (int64_t d = 0; d < dim; d += 16) {
      const __m512 vv = load16(v + d);
      for (int64_t g = 0; g < group; ++g) {
        float* a = acc + g * dim + d;
        _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_set1_ps(w[g * w_stride]), vv, _mm512_loadu_ps(a)));
      }
    }
    return;
  }
#elif defined(__x86_64__)
  if (dim % 8 == 0 && avx2_ready()) return axpy_rows_avx2(w, w_stride, v, group, dim, acc);
#endif
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < dim; ++d) acc[g * dim + d] += w[g * w_stride] * widen(v[d]);
}

#if defined(__AVX512F__)
// The AVX-512 path for head sizes of 64 and 128 (NC = 4 or 8 chunks of 16 floats): G query
// heads of one KV head at a time, their query rows (scores) and output sums (PV) held in
// registers across every position rather than reloaded from memory per position (a 16-row
// layer at context 144, hot: 125 -> 41 us, bench/decode_attention.py's case).

// Cache rows (K and V, every KV head of the task at a position) are fetched this many
// positions ahead by the first query heads' score pass: blocks lie anywhere in the cache, so
// the hardware prefetcher only finds a block's run of rows once it is being read (in step,
// from memory, a 16-row layer at context 144 took 210 -> 115 us with it, bench-like, ad hoc).
constexpr int64_t kPrefetchAhead = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t bytes) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

template <int NC, int G, typename T>
inline void qk_registers(const float* q, const T* kbase, const int64_t* offs, int64_t n,
                         float* s, const T* prefetch_k, const T* prefetch_v,
                         int64_t prefetch_bytes) {
  __m512 qv[G][NC];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) qv[g][c] = _mm512_loadu_ps(q + (g * NC + c) * 16);
  for (int64_t i = 0; i < n; ++i) {
    if (prefetch_bytes && i + kPrefetchAhead < n) {
      prefetch_row(prefetch_k + offs[i + kPrefetchAhead], prefetch_bytes);
      prefetch_row(prefetch_v + offs[i + kPrefetchAhead], prefetch_bytes);
    }
    const T* k = kbase + offs[i];
    __m512 kc[NC];
    for (int c = 0; c < NC; ++c) kc[c] = load16(k + 16 * c);
    for (int g = 0; g < G; ++g) {
      __m512 a = _mm512_mul_ps(qv[g][0], kc[0]);
      for (int c = 1; c < NC; ++c) a = _mm512_fmadd_ps(qv[g][c], kc[c], a);
      s[g * n + i] = _mm512_reduce_add_ps(a);
    }
  }
}

template <int NC, int G, typename T>
inline void pv_registers(const float* w, const T* vbase, const int64_t* offs, int64_t n,
                         float* out) {
  __m512 acc[G][NC];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const T* v = vbase + offs[i];
    __m512 vc[NC];
    for (int c = 0; c < NC; ++c) vc[c] = load16(v + 16 * c);
    for (int g = 0; g < G; ++g) {
      const __m512 wg = _mm512_set1_ps(w[g * n + i]);
      for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_fmadd_ps(wg, vc[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out + (g * NC + c) * 16, acc[g][c]);
}

// One KV head's `group` query heads: scores s [group, n] (soft-capped where softcap > 0, then
// softmax numerators, their sums' inverses in inv), and unnormalised output sums out [group,
// NC * 16]. Query heads go G at a time, as many as registers hold with their KV row (G * NC +
// NC of 32).
// kp/vp: the caches from the task's first KV head; `prefetch_bytes` of each position's K and
// V rows from there are prefetched (by the task's first head; 0 for the others, whose rows
// are then in cache).
template <int NC, typename T>
void head_registers(const float* q, const T* kp, const T* vp, int64_t head, const int64_t* offs,
                    int64_t n, int64_t group, float* s, float* out, float* inv,
                    int64_t prefetch_bytes, float softcap, const float* sinks,
                    const float* alibi, int64_t first, int64_t query) {
  constexpr int kStep = NC == 4 ? 4 : 2;
  constexpr int64_t dim = NC * 16;
  const T* kbase = kp + head * dim;
  const T* vbase = vp + head * dim;
  for (int64_t g0 = 0; g0 < group; g0 += kStep) {
    const int64_t pf = g0 == 0 ? prefetch_bytes : 0;
    with_group<kStep>(group - g0, [&](auto g) {
      qk_registers<NC, decltype(g)::value>(q + g0 * dim, kbase, offs, n, s + g0 * n, kp, vp, pf);
    });
  }
  for (int64_t g = 0; g < group; ++g) {
    if (softcap > 0.f) soft_cap(s + g * n, n, softcap);
    if (alibi) add_alibi(s + g * n, n, alibi[g], first, query);
    inv[g] = 1.f / softmax_numerators(s + g * n, n, sinks ? sinks[g] : kNoSink);
  }
  for (int64_t g0 = 0; g0 < group; g0 += kStep) {
    with_group<kStep>(group - g0, [&](auto g) {
      pv_registers<NC, decltype(g)::value>(s + g0 * n, vbase, offs, n, out + g0 * dim);
    });
  }
}
#endif

template <typename T>
void decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& block_tables, const at::Tensor& context_lens, at::Tensor& out,
            double scale, int64_t window, float softcap, const float* sinks,
            const float* alibi) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = heads / kv_heads, max_blocks = block_tables.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  T* op = out.data_ptr<T>();
  const int64_t row_stride = kv_heads * dim;  // one position of a block: every KV head
  // A task is a sequence with all its KV heads, so that it reads each cached position's row
  // whole and in order; with fewer sequences than threads, a sequence's single KV head.
  const int64_t split = batch >= at::get_num_threads() ? 1 : kv_heads;
  const int64_t per_task = kv_heads / split;
  at::parallel_for(0, batch * split, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(per_task * group * dim), acc(per_task * group * dim), scores;
    std::vector<float> inv(per_task * group);
    std::vector<int64_t> offs;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / split, h0 = (task % split) * per_task;
      const int64_t ctx = lens[b];
      const int64_t first = window > 0 ? std::max<int64_t>(0, ctx - window) : 0;
      const int64_t n = ctx - first;
      const int64_t rows = per_task * group;  // query heads of this task, [h][g]
      const int32_t* table = tables + b * max_blocks;
      // Where each position's row (every KV head) lies in the caches, found once
      // per sequence a block at a time: no division per read, and K and V share it.
      offs.resize(n);
      for (int64_t i = 0, pos = first; i < n;) {
        const int64_t within = pos % block_size;
        const int64_t row = int64_t(table[pos / block_size]) * block_size + within;
        const int64_t take = std::min(block_size - within, n - i);
        for (int64_t t = 0; t < take; ++t) offs[i + t] = (row + t) * row_stride;
        i += take;
        pos += take;
      }
      const T* qrow = qp + b * q.stride(0) + h0 * group * dim;
      for (int64_t j = 0; j < rows * dim; ++j) qf[j] = widen(qrow[j]) * float(scale);
      scores.resize(rows * n);
      bool in_registers = false;
#if defined(__AVX512F__)
      in_registers = dim == 64 || dim == 128;
      for (int64_t h = 0; in_registers && h < per_task; ++h) {
        const int64_t at = h * group;
        auto run = dim == 64 ? head_registers<4, T> : head_registers<8, T>;
        // The first head's pass prefetches the rows whole (the task's heads: all, or one).
        const int64_t prefetch_bytes = h == 0 ? per_task * dim * int64_t(sizeof(T)) : 0;
        run(qf.data() + at * dim, kp + h0 * dim, vp + h0 * dim, h, offs.data(), n, group,
            scores.data() + at * n, acc.data() + at * dim, inv.data() + at, prefetch_bytes,
            softcap, sinks ? sinks + h0 * group + at : nullptr,
            alibi ? alibi + h0 * group + at : nullptr, first, ctx - 1);
      }
#endif
      if (!in_registers) {
        for (int64_t i = 0; i < n; ++i) {
          const T* krow = kp + offs[i] + h0 * dim;
          for (int64_t h = 0; h < per_task; ++h)
            dot_rows(qf.data() + h * group * dim, krow + h * dim, group, dim,
                     scores.data() + h * group * n + i, n);
        }
        for (int64_t r = 0; r < rows; ++r) {
          if (softcap > 0.f) soft_cap(scores.data() + r * n, n, softcap);
          if (alibi) add_alibi(scores.data() + r * n, n, alibi[h0 * group + r], first, ctx - 1);
          const float sink = sinks ? sinks[h0 * group + r] : kNoSink;
          inv[r] = 1.f / softmax_numerators(scores.data() + r * n, n, sink);
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t i = 0; i < n; ++i) {
          const T* vrow = vp + offs[i] + h0 * dim;
          for (int64_t h = 0; h < per_task; ++h)
            axpy_rows(scores.data() + h * group * n + i, n, vrow + h * dim, group, dim,
                      acc.data() + h * group * dim);
        }
      }
      T* orow = op + (b * heads + h0 * group) * dim;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t d = 0; d < dim; ++d) orow[r * dim + d] = static_cast<T>(acc[r * dim + d] * inv[r]);
    }
  });
}

// The layout and dtype checks paged_decode and paged_prefill share (`what` names the kernel).
void check_paged_inputs(const char* what, const at::Tensor& q, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& block_tables,
                        const at::Tensor& context_lens) {
  // q may be a view into the fused qkv rows (rotary's output): each row's heads contiguous.
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && (q.size(1) == 1 || q.stride(1) == q.size(2)),
              what, ": q must be [tokens, heads, dim], each row's heads contiguous");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(),
              what, ": caches must be [blocks, block_size, kv_heads, dim], contiguous");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              what, ": q and the caches must share a dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt,
              what, ": block tables and context lengths must be int32");
  TORCH_CHECK(block_tables.dim() == 2, what, ": block tables must be [rows, max_blocks]");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, what, ": heads must be a multiple of kv heads");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(3) == q.size(2),
              what, ": the caches' head size must be q's");
}

// Every position a row reads must lie in a block of the cache: a bad table never reads out of
// it. `rows`: the block table rows to check (all of them when empty).
void check_block_reach(const char* what, const at::Tensor& tables, const at::Tensor& lens,
                       int64_t block_size, int64_t num_blocks, const std::vector<int64_t>& rows) {
  const int64_t width = tables.size(1), count = rows.empty() ? tables.size(0) : int64_t(rows.size());
  const int32_t* tp = tables.data_ptr<int32_t>();
  const int32_t* lp = lens.data_ptr<int32_t>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t b = rows.empty() ? i : rows[i];
    const int64_t ctx = lp[b];
    TORCH_CHECK(ctx >= 1 && ctx <= width * block_size, what, ": row ", b, ": context length ",
                ctx, " outside 1..", width * block_size, " (its block table's reach)");
    for (int64_t j = 0; j < (ctx + block_size - 1) / block_size; ++j) {
      const int64_t block = tp[b * width + j];
      TORCH_CHECK(block >= 0 && block < num_blocks, what, ": row ", b, ": block ", block,
                  " is not in the cache (", num_blocks, " blocks)");
    }
  }
}

}  // namespace

// Which arithmetic the attention kernels run on this CPU and build: "avx512" (the build targets
// it), "avx2" (attention_avx2.cpp) or "scalar"; for the logs and the tests.
std::string attention_path() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(__x86_64__)
  return avx2_ready() ? "avx2" : "scalar";
#else
  return "scalar";
#endif
}

// softcap: Gemma 2's attention-logit soft-capping of each scaled score (0: none). sinks: None, or
// gpt-oss's attention sinks, [heads] float32: each query head's softmax counts e^sink too.
// alibi: None, or ALiBi's slopes, [heads] float32: head h adds alibi[h] * (key position - query
// position) to each (capped) score.
at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& context_lens,
                        double scale, int64_t window, double softcap,
                        const c10::optional<at::Tensor>& sinks,
                        const c10::optional<at::Tensor>& alibi) {
  check_paged_inputs("paged_decode", q, k_cache, v_cache, block_tables, context_lens);
  TORCH_CHECK(softcap >= 0, "paged_decode: softcap must be 0 (none) or positive, not ", softcap);
  at::Tensor sink_values;
  if (sinks.has_value()) {
    sink_values = sinks->contiguous();
    TORCH_CHECK(sink_values.scalar_type() == at::kFloat && sink_values.dim() == 1 &&
                    sink_values.size(0) == q.size(1),
                "paged_decode: sinks must be float32 [heads] (", q.size(1), " heads)");
  }
  at::Tensor slopes;
  if (alibi.has_value()) {
    slopes = alibi->contiguous();
    TORCH_CHECK(slopes.scalar_type() == at::kFloat && slopes.dim() == 1 &&
                    slopes.size(0) == q.size(1),
                "paged_decode: alibi must be float32 [heads] slopes (", q.size(1), " heads)");
  }
  TORCH_CHECK(block_tables.size(0) == q.size(0) && context_lens.numel() == q.size(0),
              "paged_decode: one block table row and one context length per query row");
  auto tables = block_tables.contiguous();
  auto lens = context_lens.contiguous();
  check_block_reach("paged_decode", tables, lens, k_cache.size(1), k_cache.size(0), {});
  auto out = at::empty(q.sizes(), q.options());
  with_dtype(q.scalar_type(), "paged_decode", [&](auto tag) {
    decode<decltype(tag)>(q, k_cache, v_cache, tables, lens, out, scale, window, float(softcap),
                          sinks.has_value() ? sink_values.data_ptr<float>() : nullptr,
                          alibi.has_value() ? slopes.data_ptr<float>() : nullptr);
  });
  return out;
}

// Writes each new token's K and V rows into its cache slot (slot = block * block_size +
// offset), the step's first use of the cache: torch's index_copy_ pair and int64 cast cost
// ~50 us a layer at a 16-row decode step on a 2-core CPU, a plain row copy a few.
void store_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache,
              const at::Tensor& slot_mapping) {
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
              "kv_cache: [2, blocks, block_size, kv_heads, dim], contiguous");
  const int64_t row = kv_cache.size(3) * kv_cache.size(4);  // elements of one token's K or V
  const int64_t slots = kv_cache.size(1) * kv_cache.size(2);
  TORCH_CHECK(key.dim() == 3 && key.sizes() == value.sizes() &&
                  key.size(1) * key.size(2) == row && key.size(2) == kv_cache.size(4),
              "key and value: [tokens, kv_heads, dim] of the cache's heads and head size");
  TORCH_CHECK(key.scalar_type() == kv_cache.scalar_type() &&
                  value.scalar_type() == kv_cache.scalar_type(),
              "key, value and the cache must share a dtype");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == key.size(0),
              "one slot per token");
  // Tokens may be strided (K and V are views into the fused QKV product); a token's row not.
  const auto rows_of = [&](const at::Tensor& t) {
    return t.stride(2) == 1 && t.stride(1) == t.size(2) ? t : t.contiguous();
  };
  const at::Tensor k = rows_of(key), v = rows_of(value);
  const at::Tensor slot = slot_mapping.to(at::kLong).contiguous();
  const int64_t* sp = slot.data_ptr<int64_t>();
  for (int64_t t = 0; t < k.size(0); ++t)
    TORCH_CHECK(sp[t] >= 0 && sp[t] < slots, "token ", t, ": slot ", sp[t],
                " is not in the cache (", slots, " slots)");
  const int64_t bytes = row * kv_cache.element_size();
  char* kc = static_cast<char*>(kv_cache.data_ptr());
  char* vc = kc + slots * bytes;
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  const int64_t ks = k.stride(0) * k.element_size(), vs = v.stride(0) * v.element_size();
  for (int64_t t = 0; t < k.size(0); ++t) {
    std::memcpy(kc + sp[t] * bytes, kp + t * ks, bytes);
    std::memcpy(vc + sp[t] * bytes, vp + t * vs, bytes);
  }
}
