// paged_prefill.cpp's attention in bf16 on the AMX tile unit, where the CPU has one: the same
// tasks, key ranges and fp32 softmax, with Q K^T and P V as tile products.
//
// Why: the vector kernel spends two fp32 FMAs a score and dimension (Q K^T, then P V); at ~130
// GFLOP/s it took ~35 ms of a 1,080-token prefill step (9 prompts of 120 tokens, SmolLM2 shape)
// and more than SDPA per score on longer prompts. The tile unit multiplies 16 x 32 bf16 by 32 x
// 16 in one instruction; what is left is the softmax's exponentials.
//
// Per task (sequence, KV head, up to kQueryBlock query tokens):
//   - the keys it sees are staged once as the B operand of Q K^T (per 16 keys and 32 dimensions
//     a 1 KiB tile whose row r holds dimensions 2r, 2r + 1 of each key) and the values as the B
//     operand of P V (per 32 keys and 16 dimensions a tile whose row r holds keys 2r, 2r + 1 of
//     each dimension); dimensions are padded with zeros to 32, keys to 32;
//   - its query rows (token-major, the group's heads within a token) in tiles of 16: scores of
//     up to 4 key blocks at a time, scaled (and soft-capped, where asked) and soft-maxed in fp32
//     over each row's own keys (causal, windowed) exactly as the vector kernel does, the
//     numerators rounded to bf16 (as SDPA's flash kernel rounds them) for P V, whose fp32 sums
//     are divided by the fp32 sum and rounded once.
#if defined(SWITCHYARD_AMX)
namespace {

// Tiles 0-3: accumulators (4 key blocks' scores, or 4 dimension blocks' sums); 4: the A
// operand (16 query rows, or their 16 rows of probabilities); 5, 6: B operands. All 16 x 64 B.
void configure_attention_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 7; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// Accumulator tile t (0-3) += tile 4 times tile 5 + t % 2 (B operands alternate so that a load
// can overlap the previous product), and that B tile's load. The tile instructions take tile
// numbers as literals.
template <int t>
inline void tile_product_into() {
  if constexpr (t == 0) _tile_dpbf16ps(0, 4, 5);
  if constexpr (t == 1) _tile_dpbf16ps(1, 4, 6);
  if constexpr (t == 2) _tile_dpbf16ps(2, 4, 5);
  if constexpr (t == 3) _tile_dpbf16ps(3, 4, 6);
}
template <int t>
inline void load_b(const uint16_t* p) {
  if constexpr (t % 2 == 0) _tile_loadd(5, p, 64);
  else _tile_loadd(6, p, 64);
}

template <int NB>
inline void zero_accumulators() {
  _tile_zero(0);
  if constexpr (NB > 1) _tile_zero(1);
  if constexpr (NB > 2) _tile_zero(2);
  if constexpr (NB > 3) _tile_zero(3);
}

// Accumulator tiles 0.. NB - 1 into dst's columns 0, 16, .. (row stride ld floats).
template <int NB>
inline void store_accumulators(float* dst, int64_t ld) {
  _tile_stored(0, dst, ld * 4);
  if constexpr (NB > 1) _tile_stored(1, dst + 16, ld * 4);
  if constexpr (NB > 2) _tile_stored(2, dst + 32, ld * 4);
  if constexpr (NB > 3) _tile_stored(3, dst + 48, ld * 4);
}

// Scores of 16 query rows (q: [16][dsteps * 32] bf16) against NB consecutive blocks of 16 staged
// keys (kt: the first block's tiles, dsteps of 512 values a block), into s's columns 0.. 16 NB
// (row stride lds floats).
template <int NB>
void score_tile(const uint16_t* q, int64_t dsteps, const uint16_t* kt, float* s, int64_t lds) {
  zero_accumulators<NB>();
  for (int64_t d = 0; d < dsteps; ++d) {
    _tile_loadd(4, q + d * 32, dsteps * 64);
    load_b<0>(kt + d * 512);
    tile_product_into<0>();
    if constexpr (NB > 1) {
      load_b<1>(kt + (dsteps + d) * 512);
      tile_product_into<1>();
    }
    if constexpr (NB > 2) {
      load_b<2>(kt + (2 * dsteps + d) * 512);
      tile_product_into<2>();
    }
    if constexpr (NB > 3) {
      load_b<3>(kt + (3 * dsteps + d) * 512);
      tile_product_into<3>();
    }
  }
  store_accumulators<NB>(s, lds);
}

// Sums over ksteps x 32 keys of 16 rows of probabilities (p: [16][ldp] bf16) times NB blocks of
// 16 dimensions of the staged values (vt: the first key step's tile of the first block; a key
// step is dblocks tiles), into o [16][64] fp32's columns 0.. 16 NB.
template <int NB>
void weigh_tile(const uint16_t* p, int64_t ldp, const uint16_t* vt, int64_t ksteps,
                int64_t dblocks, float* o) {
  zero_accumulators<NB>();
  for (int64_t k = 0; k < ksteps; ++k) {
    _tile_loadd(4, p + k * 32, ldp * 2);
    const uint16_t* v = vt + k * dblocks * 512;
    load_b<0>(v);
    tile_product_into<0>();
    if constexpr (NB > 1) {
      load_b<1>(v + 512);
      tile_product_into<1>();
    }
    if constexpr (NB > 2) {
      load_b<2>(v + 1024);
      tile_product_into<2>();
    }
    if constexpr (NB > 3) {
      load_b<3>(v + 1536);
      tile_product_into<3>();
    }
  }
  store_accumulators<NB>(o, 64);
}

// Keys [lo, lo + n) of one KV head as score_tile's B operand (kt: n_pad / 16 blocks of dsteps
// tiles, zero past n and past dim).
void stage_keys(const uint16_t* kp, const int32_t* table, int64_t block_size, int64_t row_stride,
                int64_t lo, int64_t n, int64_t dim, int64_t dsteps, int64_t n_pad, uint32_t* kt) {
  std::fill(kt, kt + n_pad * dsteps * 16, 0u);  // 32-bit units: a key's dimension pair
  for (int64_t j = 0; j < n; ++j) {
    const int64_t row = cache_row(table, lo + j, block_size);
    const auto* pairs = reinterpret_cast<const uint32_t*>(kp + row * row_stride);
    uint32_t* block = kt + (j / 16) * dsteps * 256 + j % 16;
    for (int64_t i = 0; i < dim / 2; ++i) block[(i / 16) * 256 + (i % 16) * 16] = pairs[i];
  }
}

// Values [lo, lo + n) of one KV head as weigh_tile's B operand (vt: n_pad / 32 key steps of
// dblocks tiles, zero past n and past dim): keys 2r and 2r + 1 interleaved per dimension.
void stage_values(const uint16_t* vp, const int32_t* table, int64_t block_size,
                  int64_t row_stride, int64_t lo, int64_t n, int64_t dim, int64_t dblocks,
                  int64_t n_pad, uint16_t* vt) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(kInterleave);
  auto row_of = [&](int64_t j) { return vp + cache_row(table, lo + j, block_size) * row_stride; };
  for (int64_t j = 0; j < n_pad; j += 2) {
    const uint16_t* even = j < n ? row_of(j) : nullptr;
    const uint16_t* odd = j + 1 < n ? row_of(j + 1) : nullptr;
    uint16_t* dst = vt + (j / 32) * dblocks * 512 + ((j % 32) / 2) * 32;
    for (int64_t b = 0; b < dblocks; ++b) {
      const __mmask16 m = first_lanes(std::clamp<int64_t>(dim - b * 16, 0, 16));
      const __m256i a = even ? _mm256_maskz_loadu_epi16(m, even + b * 16) : _mm256_setzero_si256();
      const __m256i c = odd ? _mm256_maskz_loadu_epi16(m, odd + b * 16) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1);
      _mm512_storeu_si512(dst + b * 512, _mm512_permutexvar_epi16(order, both));
    }
  }
}

void prefill_amx(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const PrefillIndex& index, const std::vector<int64_t>& seqs, at::Tensor& out,
                 float scale, int64_t window, float softcap) {
  const auto [tables, max_blocks, lens, starts] = index.pointers();
  const int64_t heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = heads / kv_heads;
  const int64_t dsteps = (dim + 31) / 32, dblocks = (dim + 15) / 16;
  const int64_t q_stride = q.stride(0), row_stride = kv_heads * dim;
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr());
  const auto* kp = reinterpret_cast<const uint16_t*>(k_cache.data_ptr());
  const auto* vp = reinterpret_cast<const uint16_t*>(v_cache.data_ptr());
  auto* op = out.data_ptr<c10::BFloat16>();
  const std::vector<PrefillTask> tasks = prefill_tasks(seqs, starts, kv_heads);

  at::parallel_for(0, int64_t(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    configure_attention_tiles();
    std::vector<uint32_t> kt;
    std::vector<uint16_t> vt, qt(16 * dsteps * 32), pt;
    std::vector<float> s;
    alignas(64) float o[16 * 64];
    for (int64_t i = begin; i < end; ++i) {
      const PrefillTask& task = tasks[i];
      const int64_t b = task.seq, q_len = starts[b + 1] - starts[b];
      const int64_t prefix = lens[b] - q_len;
      const auto [lo, hi] = task_keys(task, prefix, window);
      const int64_t n = hi - lo, n_pad = (n + 31) / 32 * 32;
      const int32_t* table = tables + b * max_blocks;
      kt.resize(n_pad * dsteps * 16);
      vt.resize(n_pad * dblocks * 16);
      stage_keys(kp + task.head * dim, table, block_size, row_stride, lo, n, dim, dsteps, n_pad,
                 kt.data());
      stage_values(vp + task.head * dim, table, block_size, row_stride, lo, n, dim, dblocks,
                   n_pad, vt.data());
      s.resize(16 * n_pad);
      pt.resize(16 * n_pad);
      const int64_t rows = (task.t1 - task.t0) * group;  // token-major, the group's heads within
      for (int64_t r0 = 0; r0 < rows; r0 += 16) {
        const int64_t tile_rows = std::min<int64_t>(16, rows - r0);
        int64_t a[16], e[16];
        c10::BFloat16* dst[16];
        std::fill(qt.begin(), qt.end(), uint16_t(0));
        for (int64_t r = 0; r < tile_rows; ++r) {
          const int64_t t = task.t0 + (r0 + r) / group, g = (r0 + r) % group;
          const int64_t pos = prefix + t, token = starts[b] + t, head = task.head * group + g;
          std::copy_n(qp + token * q_stride + head * dim, dim, qt.data() + r * dsteps * 32);
          std::tie(a[r], e[r]) = query_keys(pos, lo, window);
          dst[r] = op + (token * heads + head) * dim;
        }
        const int64_t k0 = *std::min_element(a, a + tile_rows) / 32 * 32;
        const int64_t k1 = (*std::max_element(e, e + tile_rows) + 31) / 32 * 32;
        for (int64_t kb = k0 / 16; kb < k1 / 16; kb += 4) {
          with_group<4>(k1 / 16 - kb, [&](auto nb) {
            const auto* keys = reinterpret_cast<const uint16_t*>(kt.data() + kb * dsteps * 256);
            score_tile<decltype(nb)::value>(qt.data(), dsteps, keys, s.data() + kb * 16, n_pad);
          });
        }
        float inv[16];
        const __m512 scale16 = _mm512_set1_ps(scale);
        for (int64_t r = 0; r < 16; ++r) {
          uint16_t* prow = pt.data() + r * n_pad;
          std::fill(prow + k0, prow + k1, uint16_t(0));
          if (r >= tile_rows) continue;
          float* row = s.data() + r * n_pad;
          for (int64_t j = a[r]; j < e[r]; j += 16) {
            const __mmask16 m = first_lanes(std::min<int64_t>(16, e[r] - j));
            _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), scale16));
          }
          if (softcap > 0.f) soft_cap(row + a[r], e[r] - a[r], softcap);
          inv[r] = 1.f / softmax_numerators(row + a[r], e[r] - a[r]);
          for (int64_t j = a[r]; j < e[r]; j += 16) {
            const __mmask16 m = first_lanes(std::min<int64_t>(16, e[r] - j));
            _mm256_mask_storeu_epi16(prow + j, m, bf16_bits(_mm512_maskz_loadu_ps(m, row + j)));
          }
        }
        for (int64_t db = 0; db < dblocks; db += 4) {
          with_group<4>(dblocks - db, [&](auto nb) {
            constexpr int kNb = decltype(nb)::value;
            weigh_tile<kNb>(pt.data() + k0, n_pad, vt.data() + (k0 / 32 * dblocks + db) * 512,
                            (k1 - k0) / 32, dblocks, o);
            for (int64_t r = 0; r < tile_rows; ++r)
              for (int c = 0; c < kNb; ++c) {
                const int64_t d0 = (db + c) * 16;
                const __mmask16 m = first_lanes(std::clamp<int64_t>(dim - d0, 0, 16));
                store16(dst[r] + d0, _mm512_mul_ps(_mm512_load_ps(o + r * 64 + c * 16),
                                                   _mm512_set1_ps(inv[r])), m);
              }
          });
        }
      }
    }
    _tile_release();
  });
}

}  // namespace
#endif

// paged_prefill's contract, bf16 only, on the tile unit (amx_ready() must hold).
void amx_paged_prefill(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& block_tables, const at::Tensor& context_lens,
                       const at::Tensor& cu_seqlens_q, const std::vector<int64_t>& seqs,
                       at::Tensor& out, double scale, int64_t window, double softcap) {
  const PrefillIndex index = check_prefill_inputs("amx_paged_prefill", q, k_cache, v_cache,
                                                  block_tables, context_lens, cu_seqlens_q,
                                                  seqs, out, softcap);
  TORCH_CHECK(q.scalar_type() == at::kBFloat16, "amx_paged_prefill: bf16 only (the tile unit's)");
  TORCH_CHECK(q.size(2) % 2 == 0, "amx_paged_prefill: the head size must be even");
  if (seqs.empty()) return;
#if defined(SWITCHYARD_AMX)
  TORCH_CHECK(amx_permitted(), "amx_paged_prefill: the OS does not lend this process the AMX tiles");
  prefill_amx(q, k_cache, v_cache, index, seqs, out, float(scale), window, float(softcap));
#else
  TORCH_CHECK(false, "amx_paged_prefill: built without the AMX tile instructions");
#endif
}
