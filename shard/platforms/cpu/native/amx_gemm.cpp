// A bf16 linear layer on the CPU's AMX tiles (shard/layers/matmul_amx.py), for the eager path.
//
// Why: a decode step multiplies a few rows by every weight of the model once, so its GEMMs are
// bound by reading the weights. oneDNN's packed bf16 GEMM streams them at ~20-33 GB/s at 1-32
// rows here; this kernel, which does nothing but stream tiles of a weight laid out for the tile
// unit and multiply them by the rows, reads at ~40-50 GB/s (bench/amx_gemm.py).
//
// The weight layout (`packed`, [N/16, K/32, 16, 16, 2]): block (b, t) is the 16 output features
// b*16.. by the 32 inputs t*32.., as the tile unit's B operand wants it: row r holds, for each
// of the 16 outputs j, inputs t*32 + 2r and t*32 + 2r + 1 side by side (VNNI pairs). Each block
// is 1 KiB, contiguous, and an output block's K blocks follow one another, so a pass over
// outputs reads the weight front to back.
//
// The products: output features in pairs of 16-wide blocks (threads split the pairs), rows in
// pairs of 16-row tiles; 2 x 2 accumulator tiles, two row tiles and two weight tiles are all
// eight tiles. Each accumulator sums its K in order in fp32, products exact (bf16 x bf16 fits
// fp32); the bias is added in fp32 and the sum rounded once to bf16, to nearest even.
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
#include <sys/syscall.h>
#include <unistd.h>
#define SWITCHYARD_AMX 1
#endif

namespace {
#if defined(SWITCHYARD_AMX)
// Linux lends the tile registers' state to a process only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); without it the first tile instruction faults.
bool amx_permitted() {
  static const bool ok = [] {
    constexpr int kGetPerm = 0x1022, kReqPerm = 0x1023, kXtileData = 18;
    unsigned long features = 0;
    if (syscall(SYS_arch_prctl, kGetPerm, &features) == 0 && (features >> kXtileData & 1))
      return true;
    return syscall(SYS_arch_prctl, kReqPerm, kXtileData) == 0;
  }();
  return ok;
}

// Bytes of x per row block (1 MiB: half a core's L2). Measured at 256-2,048 rows, 30 cold
// layers of the SmolLM2 shape: unblocked (x re-read from L3 per output pair) 316 ms at 2,048
// rows, 256 KiB-1 MiB blocks 247-251 ms, the same within noise below 1,024 rows.
constexpr int64_t kBlockBytes = 1 << 20;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: accumulators (row tile i, output block j) = tile 2i + j; 4, 5: row tiles; 6, 7:
// weight blocks. rows0/rows1: the rows of the two row tiles (rows1 >= 1 even when unused).
void configure_tiles(int rows0, int rows1) {
  TileConfig cfg;
  const int rows[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16};
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(rows[t]);
    cfg.colsb[t] = 64;  // 16 fp32 accumulators, or 32 bf16 (16 VNNI pairs)
  }
  _tile_loadconfig(&cfg);
}

// The two row tiles' rows for rows [m0, m_end) (rows1 0: one tile), the tiles configured for
// them unless `configured` (the thread's current configuration, -1: none) already is.
inline void configure_rows(int64_t m0, int64_t m_end, int& rows0, int& rows1, int& configured) {
  rows0 = static_cast<int>(std::min<int64_t>(16, m_end - m0));
  rows1 = static_cast<int>(std::clamp<int64_t>(m_end - m0 - 16, 0, 16));
  const int want = rows0 * 32 + std::max(rows1, 1);
  if (want != configured) {
    configure_tiles(rows0, std::max(rows1, 1));
    configured = want;
  }
}

// A LoRA term as more of K (amx_lora.cpp): a pass's two output blocks also sum, over the
// listed 32-wide column blocks of their sub-modules' rows of h (bf16, each token's scaled
// shrink in its slot's columns, zeros elsewhere), h times their packed B blocks.
struct ExtraK {
  const uint16_t* h;      // h's row of the pass's first x row; row stride ldh
  int64_t ldh;
  const uint16_t* b0;     // the first output block's packed B (its 32-column blocks b_stride
  const uint16_t* b1;     // apart); the second's (if kTwoN)
  int64_t b_stride;
  int64_t h0, h1;         // the two blocks' sub-modules' first columns in h
  const int64_t* blocks;  // the column blocks (of 32) any of the step's slots occupies
  int64_t n_blocks;
};

// The sums of x's rows [0, 16 * (1 + kTwoM)) (row stride ldx) by two 16-output blocks, w and
// (if kTwoN) w1, over all of K (and `extra`'s, if any), left in accumulator tiles 0-3 (row tile
// i, output block j: tile 2i + j).
template <bool kTwoM, bool kTwoN>
void tile_products(const uint16_t* x, int64_t ldx, const uint16_t* w, const uint16_t* w1,
                   int64_t kb, const ExtraK* extra) {
  _tile_zero(0);
  if (kTwoN) _tile_zero(1);
  if (kTwoM) _tile_zero(2);
  if (kTwoM && kTwoN) _tile_zero(3);
  const uint16_t* x1 = x + 16 * ldx;
  for (int64_t t = 0; t < kb; ++t) {
    _tile_loadd(4, x + t * 32, ldx * 2);
    _tile_loadd(6, w + t * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (kTwoN) {
      _tile_loadd(7, w1 + t * 512, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (kTwoM) {
      _tile_loadd(5, x1 + t * 32, ldx * 2);
      _tile_dpbf16ps(2, 5, 6);
      if (kTwoN) _tile_dpbf16ps(3, 5, 7);
    }
  }
  if (extra == nullptr) return;
  for (int64_t i = 0; i < extra->n_blocks; ++i) {  // the two blocks may read different columns
    const int64_t c = extra->blocks[i] * 32, bc = extra->blocks[i] * extra->b_stride;
    // One output block's share: h's rows (and the 16 on, if kTwoM) by its packed B block in
    // weight tile W, into accumulator ACC (and ACC + 2). A macro: GCC's tile intrinsics take
    // the tile numbers as literals.
#define SY_EXTRA_BLOCK(ACC, ACC2, W, H, B)               \
  _tile_loadd(4, H, extra->ldh * 2);                     \
  _tile_loadd(W, B, 64);                                 \
  _tile_dpbf16ps(ACC, 4, W);                             \
  if (kTwoM) {                                           \
    _tile_loadd(5, H + 16 * extra->ldh, extra->ldh * 2); \
    _tile_dpbf16ps(ACC2, 5, W);                          \
  }
    SY_EXTRA_BLOCK(0, 2, 6, extra->h + extra->h0 + c, extra->b0 + bc)
    if (kTwoN) {
      SY_EXTRA_BLOCK(1, 3, 7, extra->h + extra->h1 + c, extra->b1 + bc)
    }
#undef SY_EXTRA_BLOCK
  }
}

// tile_products, each sum added to its 16 biases (bias, bias1; null: none) and rounded into
// out's columns n0.. and n0 + 16...
// The gated epilogue (kGated): w is a block of SwiGLU's gate g and w1 the matching block of its
// up u; out's columns n0.. get round(silu(round(g)) * round(u)), as silu_and_mul computes it
// from the rounded product (silu_times16).
template <bool kTwoM, bool kTwoN, bool kGated = false>
void tile_pass(const uint16_t* x, int64_t ldx, const uint16_t* w, const uint16_t* w1, int64_t kb,
               const ExtraK* extra, int rows0, int rows1, const c10::BFloat16* bias,
               const c10::BFloat16* bias1, c10::BFloat16* out, int64_t N, int64_t n0) {
  tile_products<kTwoM, kTwoN>(x, ldx, w, w1, kb, extra);
  alignas(64) float acc[16][16];
  if constexpr (kGated) {
    alignas(64) float up[16][16];
    const __m512 gb = bias ? load16(bias) : _mm512_setzero_ps();
    const __m512 ub = bias1 ? load16(bias1) : _mm512_setzero_ps();
    auto emit = [&](int rows, int64_t row0) {
      for (int r = 0; r < rows; ++r) {
        const __m512 g = round_to<c10::BFloat16>(_mm512_add_ps(_mm512_load_ps(acc[r]), gb));
        const __m512 u = round_to<c10::BFloat16>(_mm512_add_ps(_mm512_load_ps(up[r]), ub));
        store16(out + (row0 + r) * N + n0, silu_times16<c10::BFloat16>(g, u), 0xffff);
      }
    };
    _tile_stored(0, acc, 64);
    _tile_stored(1, up, 64);
    emit(rows0, 0);
    if (kTwoM) {
      _tile_stored(2, acc, 64);
      _tile_stored(3, up, 64);
      emit(rows1, 16);
    }
    return;
  }
  auto emit = [&](int rows, int64_t row0, int64_t col0, const c10::BFloat16* b16) {
    const __m512 b = b16 ? load16(b16) : _mm512_setzero_ps();  // bf16 widens exactly
    for (int r = 0; r < rows; ++r)
      store16(out + (row0 + r) * N + col0, _mm512_add_ps(_mm512_load_ps(acc[r]), b), 0xffff);
  };
  _tile_stored(0, acc, 64);
  emit(rows0, 0, n0, bias);
  if (kTwoN) {
    _tile_stored(1, acc, 64);
    emit(rows0, 0, n0 + 16, bias1);
  }
  if (kTwoM) {
    _tile_stored(2, acc, 64);
    emit(rows1, 16, n0, bias);
    if (kTwoN) {
      _tile_stored(3, acc, 64);
      emit(rows1, 16, n0 + 16, bias1);
    }
  }
}
#endif

}  // namespace

// Whether amx_linear runs here: built with the tile instructions, and lent the tiles by the OS.
bool amx_ready() {
#if defined(SWITCHYARD_AMX)
  return amx_permitted();
#else
  return false;
#endif
}

namespace {
// A LoRA term to add to run_linear's product as more of K (amx_lora.cpp builds it).
struct LoraProducts {
  const uint16_t* h;              // [M, ldh] bf16
  int64_t ldh;
  const uint16_t* b;              // packed B, [column blocks of 32, N/16, 16, 16, 2]
  std::vector<int64_t> h_column;  // per output block: its sub-module's first column in h
  std::vector<int64_t> blocks;    // ExtraK::blocks
};

// amx_linear's and amx_linear_silu_mul's checks and loop (`what` names the caller): x [M, K]
// by the packed weight's N outputs (plus `lora`'s term, if any), into out [M, N] or, gated,
// [M, N / 2].
torch::Tensor run_linear(const char* what, const torch::Tensor& x, const torch::Tensor& packed,
                         const c10::optional<torch::Tensor>& bias, bool gated,
                         const LoraProducts* lora = nullptr) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, what, ": x must be [M, K] with contiguous rows");
  TORCH_CHECK(packed.dim() == 5 && packed.is_contiguous() && packed.size(2) == 16 &&
                  packed.size(3) == 16 && packed.size(4) == 2,
              what, ": the weight must be packed [N/16, K/32, 16, 16, 2]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
              what, ": x and the weight must be bfloat16");
  const int64_t M = x.size(0), K = x.size(1), nb = packed.size(0), kb = packed.size(1);
  const int64_t N = nb * 16;
  TORCH_CHECK(K == kb * 32, what, ": x has ", K, " features, the weight ", kb * 32);
  TORCH_CHECK(!gated || nb % 2 == 0, what, ": the gate and up halves must be whole 16-output blocks (",
              N, " outputs)");
  torch::Tensor bias_rows;  // the bias as read: bf16, widened per 16 lanes in the epilogue
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == at::kBFloat16,
                what, ": the bias must be [", N, "] bfloat16");
    bias_rows = bias->contiguous();  // no copy for a layer's own (contiguous) bias
  }
  const int64_t out_cols = gated ? N / 2 : N;
  auto out = torch::empty({M, out_cols}, x.options());
  if (M == 0) return out;
#if defined(SWITCHYARD_AMX)
  TORCH_CHECK(amx_permitted(), what, ": the OS does not lend this process the AMX tiles");
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  const c10::BFloat16* bp = bias_rows.defined() ? bias_rows.data_ptr<c10::BFloat16>() : nullptr;
  auto* op = out.data_ptr<c10::BFloat16>();
  // A task's pair of 16-output blocks: (2p, 2p + 1), or gated (p, p + nb / 2): a gate block and
  // its up block, so the epilogue has both.
  const int64_t ldx = x.stride(0), pairs = gated ? nb / 2 : (nb + 1) / 2;
  // Rows in blocks whose x stays in L2 while the threads stream their share of the weight past
  // it; a long prefill re-reads the weight once per block instead of x once per output pair.
  const int64_t block_rows = std::max<int64_t>(32, (kBlockBytes / (K * 2)) / 32 * 32);
  for (int64_t mb = 0; mb < M; mb += block_rows) {
    const int64_t mend = std::min(M, mb + block_rows);
    at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
      int configured = -1;  // rows0 * 32 + rows1 of the loaded configuration
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t b0 = gated ? p : 2 * p, b1 = gated ? p + nb / 2 : 2 * p + 1;
        const bool two_n = b1 < nb;
        const uint16_t* w = wp + b0 * kb * 512;
        const uint16_t* w1 = wp + b1 * kb * 512;
        const c10::BFloat16* bias0 = bp ? bp + b0 * 16 : nullptr;
        const c10::BFloat16* bias1 = bp && two_n ? bp + b1 * 16 : nullptr;
        for (int64_t m0 = mb; m0 < mend; m0 += 32) {
          int rows0, rows1;
          configure_rows(m0, mend, rows0, rows1, configured);
          const uint16_t* xr = xp + m0 * ldx;
          c10::BFloat16* o = op + m0 * out_cols;
          const int64_t n0 = b0 * 16;
          ExtraK extra;
          if (lora != nullptr) {
            const int64_t b1_or_b0 = two_n ? b1 : b0;
            extra = {lora->h + m0 * lora->ldh,   lora->ldh,
                     lora->b + b0 * 512,         lora->b + b1_or_b0 * 512,
                     nb * 512,                   lora->h_column[b0],
                     lora->h_column[b1_or_b0],   lora->blocks.data(),
                     int64_t(lora->blocks.size())};
          }
          const ExtraK* more = lora != nullptr ? &extra : nullptr;
#define SY_PASS(TWO_M, TWO_N, GATED)                                                   \
  tile_pass<TWO_M, TWO_N, GATED>(xr, ldx, w, w1, kb, more, rows0, rows1, bias0, bias1, o, \
                                 out_cols, n0)
          if (gated && rows1 > 0) SY_PASS(true, true, true);
          else if (gated) SY_PASS(false, true, true);
          else if (rows1 > 0 && two_n) SY_PASS(true, true, false);
          else if (rows1 > 0) SY_PASS(true, false, false);
          else if (two_n) SY_PASS(false, true, false);
          else SY_PASS(false, false, false);
#undef SY_PASS
        }
      }
      if (configured >= 0) _tile_release();
    });
  }
  return out;
#else
  TORCH_CHECK(false, what, ": built without the AMX tile instructions");
#endif
}
}  // namespace

// x [M, K] bf16 (rows contiguous, any row stride), packed [N/16, K/32, 16, 16, 2] bf16, bias
// [N] bf16 or None -> x @ W.T + bias, [M, N] bf16.
torch::Tensor amx_linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias) {
  return run_linear("amx_linear", x, packed, bias, false);
}

// The same weight holding SwiGLU's gate outputs then its up outputs (a fused gate_up
// projection, N = 2I) -> silu(gate) * up, [M, I], rounded as silu_and_mul rounds it after the
// projection: the [M, 2I] product is never written out and read back.
torch::Tensor amx_linear_silu_mul(torch::Tensor x, torch::Tensor packed,
                                  c10::optional<torch::Tensor> bias) {
  return run_linear("amx_linear_silu_mul", x, packed, bias, true);
}
