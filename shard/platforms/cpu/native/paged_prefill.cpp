// Paged prefill attention on the CPU (shard/attention/torch_backend.py's prefill): every query
// token of the step's prompt chunks against its sequence's cached K/V (the cached prefix and the
// chunk's own tokens, which store_kv has just written), causal, optionally windowed, read in
// place through the block table, with scores (optionally soft-capped, Gemma 2), softmax and sums
// in fp32 and the output rounded once.
//
// Why: the torch path calls SDPA once per sequence and layer, with a mask for a chunk that
// continues a prompt. A burst of 16 prompts of ~60 tokens made 480 such calls a step, ~60 ms of
// ~260 (SDPA's own ~60-90 us a call at that size, and the slicing around it). Here a step's
// sequences are one call per layer, and the arithmetic is laid out for the vector unit:
//   - a task is (sequence, KV head, block of kQueryBlock query tokens), so short prompts feed
//     every thread and a long prompt's query blocks split over them;
//   - the task's keys are widened once into fp32 blocks of 16 positions, transposed ([block][d]
//     [16]): a query row's 16 scores are then D broadcast FMAs, no horizontal sums;
//   - the query heads that share a KV head (the group) go up to 4 at a time, each loaded K or V
//     vector feeding all of them.
// Long prompts are SDPA's (its blocked GEMMs win once a sequence's q_len x keys is large: the
// backend draws the line, NATIVE_PREFILL_CELLS).
namespace {

constexpr int64_t kQueryBlock = 64;  // query tokens a task covers
constexpr int64_t kTileTokens = 2;   // tokens whose query rows are computed together
constexpr int64_t kHeadTile = 4;     // ... and of each, up to this many heads of the group
constexpr int kMaxRows = kTileTokens * kHeadTile;

#if defined(__AVX512F__)
// Scores of R scaled query rows qf [R, dim] against KB consecutive blocks of 16 staged keys
// (kt: [block][dim][16]), into s [R][n_pad] at the blocks' columns: every loaded K vector feeds
// R FMAs, and R x KB independent sums keep the FMA unit busy.
template <int R, int KB>
inline void score_rows(const float* qf, int64_t dim, const float* kt, float* s, int64_t n_pad) {
  __m512 acc[R][KB];
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < KB; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    __m512 kd[KB];
    for (int b = 0; b < KB; ++b) kd[b] = _mm512_loadu_ps(kt + b * 16 * dim + d * 16);
    for (int r = 0; r < R; ++r) {
      const __m512 qd = _mm512_set1_ps(qf[r * dim + d]);
      for (int b = 0; b < KB; ++b) acc[r][b] = _mm512_fmadd_ps(qd, kd[b], acc[r][b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < KB; ++b) _mm512_storeu_ps(s + r * n_pad + b * 16, acc[r][b]);
}

// out[r][dc .. dc + 16 NC) = inv[r] * sum_j p[r][j] v[j] over keys [a, e) (vf: [key][dim_pad]
// fp32; p zero where row r does not see key j), rounded once into out's type.
template <int R, int NC, typename T>
inline void weigh_values(const float* p, int64_t n_pad, int64_t a, int64_t e, const float* vf,
                         int64_t dim_pad, int64_t dc, int64_t dim, const float* inv,
                         T* const* out) {
  __m512 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t j = a; j < e; ++j) {
    __m512 v[NC];
    for (int c = 0; c < NC; ++c) v[c] = _mm512_loadu_ps(vf + j * dim_pad + dc + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_set1_ps(p[r * n_pad + j]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(w, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) {
      const int64_t d0 = dc + 16 * c;
      const __mmask16 m = first_lanes(std::clamp<int64_t>(dim - d0, 0, 16));
      store16(out[r] + d0, _mm512_mul_ps(acc[r][c], _mm512_set1_ps(inv[r])), m);
    }
}

// weigh_values over every dim chunk, NC as large as R x NC <= 24 accumulators allow.
template <int R, typename T>
inline void weigh_all(const float* p, int64_t n_pad, int64_t a, int64_t e, const float* vf,
                      int64_t dim_pad, int64_t dim, const float* inv, T* const* out) {
  constexpr int kMaxChunks = std::min(4, 24 / R);
  for (int64_t dc = 0; dc < dim_pad; dc += 16 * kMaxChunks) {
    switch (std::min<int64_t>(kMaxChunks, (dim_pad - dc) / 16)) {
      case 1: weigh_values<R, 1>(p, n_pad, a, e, vf, dim_pad, dc, dim, inv, out); break;
      case 2: weigh_values<R, std::min(2, kMaxChunks)>(p, n_pad, a, e, vf, dim_pad, dc, dim, inv, out); break;
      case 3: weigh_values<R, std::min(3, kMaxChunks)>(p, n_pad, a, e, vf, dim_pad, dc, dim, inv, out); break;
      default: weigh_values<R, kMaxChunks>(p, n_pad, a, e, vf, dim_pad, dc, dim, inv, out); break;
    }
  }
}
#endif

// One tile of R query rows (qf [R, dim], scaled fp32), row r seeing the staged keys [a[r], e[r])
// of kt / vf: scores into s [R][n_pad], soft-capped where softcap > 0, softmax, and the
// weighted values into out[r].
template <int R, typename T>
void attend_rows(const float* qf, const int64_t* a, const int64_t* e, const float* kt,
                 const float* vf, int64_t dim, int64_t dim_pad, float* s, int64_t n_pad,
                 T* const* out, float softcap) {
  const int64_t lo = *std::min_element(a, a + R), hi = *std::max_element(e, e + R);
  float inv[R];
#if defined(__AVX512F__)
  int64_t kb = lo / 16;
  for (; (kb + 1) * 16 < hi; kb += 2) score_rows<R, 2>(qf, dim, kt + kb * 16 * dim, s + kb * 16, n_pad);
  if (kb * 16 < hi) score_rows<R, 1>(qf, dim, kt + kb * 16 * dim, s + kb * 16, n_pad);
#else
#if defined(__x86_64__)
  const bool avx2 = avx2_ready();
  if (avx2) score_rows_avx2(qf, R, dim, kt, lo, hi, s, n_pad);
#else
  const bool avx2 = false;
#endif
  for (int r = 0; r < R && !avx2; ++r)
    for (int64_t j = lo; j < hi; ++j) {
      float dot = 0.f;
      for (int64_t d = 0; d < dim; ++d) dot += qf[r * dim + d] * kt[(j / 16) * 16 * dim + d * 16 + j % 16];
      s[r * n_pad + j] = dot;
    }
#endif
  for (int r = 0; r < R; ++r) {
    float* row = s + r * n_pad;
    if (softcap > 0.f) soft_cap(row + a[r], e[r] - a[r], softcap);
    inv[r] = 1.f / softmax_numerators(row + a[r], e[r] - a[r]);
    // Keys of the tile this row does not see weigh nothing in the shared value pass.
    std::fill(row + lo, row + a[r], 0.f);
    std::fill(row + e[r], row + hi, 0.f);
  }
#if defined(__AVX512F__)
  weigh_all<R>(s, n_pad, lo, hi, vf, dim_pad, dim, inv, out);
#else
#if defined(__x86_64__)
  if (avx2) return weigh_rows_avx2(s, R, n_pad, lo, hi, vf, dim_pad, dim, inv, out);
#endif
  for (int r = 0; r < R; ++r)
    for (int64_t d = 0; d < dim; ++d) {
      float sum = 0.f;
      for (int64_t j = lo; j < hi; ++j) sum += s[r * n_pad + j] * vf[j * dim_pad + d];
      out[r][d] = static_cast<T>(sum * inv[r]);
    }
#endif
}

// A unit of work: one sequence's query tokens [t0, t1) (of its chunk) with one KV head's group
// of query heads.
struct PrefillTask {
  int64_t seq, head, t0, t1;
};

std::vector<PrefillTask> prefill_tasks(const std::vector<int64_t>& seqs, const int32_t* starts,
                                       int64_t kv_heads) {
  std::vector<PrefillTask> tasks;
  for (const int64_t b : seqs) {
    const int64_t q_len = starts[b + 1] - starts[b];
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t t0 = 0; t0 < q_len; t0 += kQueryBlock)
        tasks.push_back({b, h, t0, std::min(q_len, t0 + kQueryBlock)});
  }
  return tasks;
}

// The keys a task's queries see, [lo, hi) in positions: hi past its last query's position, lo
// where its first query's window begins (0 without one).
inline std::pair<int64_t, int64_t> task_keys(const PrefillTask& task, int64_t prefix,
                                             int64_t window) {
  const int64_t hi = prefix + task.t1;
  const int64_t lo = window > 0 ? std::max<int64_t>(0, prefix + task.t0 + 1 - window) : 0;
  return {lo, hi};
}

// A query at position pos sees keys [a, e) relative to lo: itself and those before it in its
// window.
inline std::pair<int64_t, int64_t> query_keys(int64_t pos, int64_t lo, int64_t window) {
  return {window > 0 ? std::max<int64_t>(0, pos + 1 - window - lo) : 0, pos + 1 - lo};
}

// The cache row holding a sequence's position pos (table: its block table).
inline int64_t cache_row(const int32_t* table, int64_t pos, int64_t block_size) {
  return int64_t(table[pos / block_size]) * block_size + pos % block_size;
}

// The step's index tensors, contiguous, once checked against the caches and q.
struct PrefillIndex {
  at::Tensor tables, lens, starts;
  // (block tables, their row length, context lengths, query offsets) as the loops read them.
  std::tuple<const int32_t*, int64_t, const int32_t*, const int32_t*> pointers() const {
    return {tables.data_ptr<int32_t>(), tables.size(1), lens.data_ptr<int32_t>(),
            starts.data_ptr<int32_t>()};
  }
};

template <typename T>
void prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
             const PrefillIndex& index, const std::vector<int64_t>& seqs, at::Tensor& out,
             float scale, int64_t window, float softcap) {
  const auto [tables, max_blocks, lens, starts] = index.pointers();
  const int64_t heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = heads / kv_heads, dim_pad = (dim + 15) / 16 * 16;
  const int64_t q_stride = q.stride(0), row_stride = kv_heads * dim;
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();

  const std::vector<PrefillTask> tasks = prefill_tasks(seqs, starts, kv_heads);
  at::parallel_for(0, int64_t(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt, vf, scores, qf(kMaxRows * dim);
    for (int64_t i = begin; i < end; ++i) {
      const PrefillTask& task = tasks[i];
      const int64_t b = task.seq, q_len = starts[b + 1] - starts[b];
      const int64_t prefix = lens[b] - q_len;  // cached positions before the chunk
      const auto [lo, hi] = task_keys(task, prefix, window);
      const int64_t n = hi - lo, n_pad = (n + 15) / 16 * 16;
      // Stage the head's keys, transposed in blocks of 16 positions, and its values, in fp32
      // (zeros past n and past dim, which no result reads).
      kt.assign(n_pad * dim, 0.f);
      vf.assign(n * dim_pad, 0.f);
      const int32_t* table = tables + b * max_blocks;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t pos = lo + j;
        const int64_t row = cache_row(table, pos, block_size);
        const T* krow = kp + row * row_stride + task.head * dim;
        const T* vrow = vp + row * row_stride + task.head * dim;
        float* kblock = kt.data() + (j / 16) * 16 * dim + j % 16;
        for (int64_t d = 0; d < dim; ++d) kblock[d * 16] = widen(krow[d]);
        for (int64_t d = 0; d < dim; ++d) vf[j * dim_pad + d] = widen(vrow[d]);
      }
      scores.resize(kMaxRows * n_pad);
      // Tiles of up to kTileTokens tokens x kHeadTile of the group's heads.
      for (int64_t t0 = task.t0; t0 < task.t1; t0 += kTileTokens) {
        const int64_t tokens = std::min(kTileTokens, task.t1 - t0);
        for (int64_t g0 = 0; g0 < group; g0 += kHeadTile) {
          const int64_t tile = std::min(kHeadTile, group - g0);
          int64_t a[kMaxRows], e[kMaxRows];
          T* rows_out[kMaxRows];
          int64_t r = 0;
          for (int64_t t = t0; t < t0 + tokens; ++t) {
            const int64_t pos = prefix + t, token = starts[b] + t;
            const int64_t head0 = task.head * group + g0;
            const T* qrow = qp + token * q_stride + head0 * dim;
            for (int64_t g = 0; g < tile; ++g, ++r) {
              for (int64_t d = 0; d < dim; ++d) qf[r * dim + d] = widen(qrow[g * dim + d]) * scale;
              std::tie(a[r], e[r]) = query_keys(pos, lo, window);
              rows_out[r] = op + (token * heads + head0 + g) * dim;
            }
          }
          with_group<kMaxRows>(r, [&](auto rows) {
            attend_rows<decltype(rows)::value, T>(qf.data(), a, e, kt.data(), vf.data(), dim,
                                                  dim_pad, scores.data(), n_pad, rows_out,
                                                  softcap);
          });
        }
      }
    }
  });
}

PrefillIndex check_prefill_inputs(const char* what, const at::Tensor& q,
                                  const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens,
                                  const at::Tensor& cu_seqlens_q, const std::vector<int64_t>& seqs,
                                  const at::Tensor& out, double softcap) {
  check_paged_inputs(what, q, k_cache, v_cache, block_tables, context_lens);
  TORCH_CHECK(softcap >= 0, what, ": softcap must be 0 (none) or positive, not ", softcap);
  const int64_t batch = block_tables.size(0);
  TORCH_CHECK(context_lens.numel() == batch && cu_seqlens_q.numel() == batch + 1 &&
                  cu_seqlens_q.scalar_type() == at::kInt,
              what, ": one context length per block table row, cu_seqlens_q [B + 1] int32");
  TORCH_CHECK(out.sizes() == q.sizes() && out.is_contiguous() &&
                  out.scalar_type() == q.scalar_type(),
              what, ": out must be a contiguous tensor of q's shape and dtype");
  PrefillIndex index{block_tables.contiguous(), context_lens.contiguous(),
                     cu_seqlens_q.contiguous()};
  const int32_t* sp = index.starts.data_ptr<int32_t>();
  const int32_t* lp = index.lens.data_ptr<int32_t>();
  TORCH_CHECK(sp[0] == 0 && sp[batch] == q.size(0), what, ": cu_seqlens_q must run from 0 to ",
              q.size(0), " (q's tokens)");
  for (const int64_t b : seqs) {
    TORCH_CHECK(b >= 0 && b < batch, what, ": sequence ", b, " outside 0..", batch - 1);
    const int64_t q_len = sp[b + 1] - sp[b];
    TORCH_CHECK(q_len >= 0 && q_len <= lp[b], what, ": sequence ", b, " has ", q_len,
                " queries but a context of ", lp[b]);
  }
  if (!seqs.empty())
    check_block_reach(what, index.tables, index.lens, k_cache.size(1), k_cache.size(0), seqs);
  return index;
}

}  // namespace

// q [T, H, D] (each row's heads contiguous, any row stride: a view into the fused qkv rows), the
// caches [blocks, block_size, Hkv, D], block_tables [B, W] and context_lens [B] int32 (tokens in
// the cache after this step, the chunk included), cu_seqlens_q [B + 1] int32 (the packed query
// offsets), seqs: the sequences to compute; out [T, H, D] contiguous, whose rows of those
// sequences are written (the others are left as they are); window: 0 for none; softcap: Gemma
// 2's attention-logit soft-capping of each scaled score, 0 for none.
void paged_prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const at::Tensor& block_tables, const at::Tensor& context_lens,
                   const at::Tensor& cu_seqlens_q, const std::vector<int64_t>& seqs,
                   at::Tensor& out, double scale, int64_t window, double softcap) {
  const PrefillIndex index = check_prefill_inputs("paged_prefill", q, k_cache, v_cache,
                                                  block_tables, context_lens, cu_seqlens_q,
                                                  seqs, out, softcap);
  if (seqs.empty()) return;
  with_dtype(q.scalar_type(), "paged_prefill", [&](auto tag) {
    prefill<decltype(tag)>(q, k_cache, v_cache, index, seqs, out, float(scale), window,
                           float(softcap));
  });
}
