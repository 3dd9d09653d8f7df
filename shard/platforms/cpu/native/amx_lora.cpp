// A bf16 linear layer and its LoRA terms in one call on the AMX tile unit (shard/layers/
// lora_amx.py): y = x W^T + bias + for each token t of slot s, scaling[s] * B_s (A_s x[t]).
//
// Why: at a decode step's size the terms are tiny, and on AVX-512 (lora.cpp) they cost more in
// arithmetic and in their own passes over y than in reading the slots' weights: ~20 us a linear
// for 16 tokens at rank 16, against ~3 us to read a slot's A and B. On the tile unit the shrink
// is one more small tile product, and the expand is more of K in the base product's own tiles:
// y's tile sums x W^T and h B^T together, rounded once, with no second pass over y.
//
// Layouts (C: columns per sub-module, a multiple of 32; rank: a multiple of 16):
//   a_tiles [n_sub * C / 16, K / 32, 16, 16, 2]: the rows j * C + s * rank + i (sub-module j,
//     slot s, rank row i) of A_j, packed as a weight (matmul_amx.py's layout);
//   b_tiles [C / 32, N / 16, 16, 16, 2]: output n's row holds B_j(s)[n, i] at column
//     s * rank + i, for n's sub-module j, packed likewise, then column blocks outermost (a pass
//     over the outputs reads the blocks of one slot's columns in order, not 1 in C / 32);
//   h [M, n_sub * C] bf16: token t's columns j * C + s * rank.. hold round(scaling[s] *
//     A_j(s) x[t]) for its own slot s, zeros elsewhere (the mask that keeps each token's term).
// Only the column blocks the step's slots occupy are multiplied: the rest of h is zero.

namespace {
#if defined(SWITCHYARD_AMX)
// h's columns of one sub-module and slot for the rows [m0, m0 + rows0 + rows1) of x: the two
// 16-row blocks a0, a1 of that slot's A (a1 null: one), each token of the slot scaled into h.
void shrink_slot(const uint16_t* x, int64_t ldx, int64_t m0, int rows0, int rows1,
                 const uint16_t* a0, const uint16_t* a1, int64_t kb, const int32_t* slots,
                 int32_t slot, float scale, c10::BFloat16* h, int64_t ldh, int64_t col) {
  const uint16_t* xr = x + m0 * ldx;
  if (rows1 > 0 && a1) tile_products<true, true>(xr, ldx, a0, a1, kb, nullptr);
  else if (rows1 > 0) tile_products<true, false>(xr, ldx, a0, a0, kb, nullptr);
  else if (a1) tile_products<false, true>(xr, ldx, a0, a1, kb, nullptr);
  else tile_products<false, false>(xr, ldx, a0, a0, kb, nullptr);
  alignas(64) float acc[16][16];
  auto emit = [&](int rows, int64_t row0, int64_t c) {
    for (int r = 0; r < rows; ++r) {
      const int64_t t = m0 + row0 + r;
      if (slots[t] != slot) continue;
      for (int i = 0; i < 16; ++i) h[t * ldh + c + i] = c10::BFloat16(scale * acc[r][i]);
    }
  };
  _tile_stored(0, acc, 64);
  emit(rows0, 0, col);
  if (a1) {
    _tile_stored(1, acc, 64);
    emit(rows0, 0, col + 16);
  }
  if (rows1 > 0) {
    _tile_stored(2, acc, 64);
    emit(rows1, 16, col);
    if (a1) {
      _tile_stored(3, acc, 64);
      emit(rows1, 16, col + 16);
    }
  }
}
#endif
}  // namespace

// x [M, K] bf16 (rows contiguous), packed [N/16, K/32, 16, 16, 2] and bias [N] | None as
// amx_linear's; gated: amx_linear_silu_mul's SwiGLU epilogue (over the sum with the terms).
// The terms: a_tiles, b_tiles as above; token_slots [M] int32 (-1: no adapter); scaling [>= S]
// fp32; rank (per slot, a multiple of 16); out_slices: the sub-modules' outputs (each a
// multiple of 16, summing to N) -> [M, N] (gated [M, N/2]) bf16, rounded once.
torch::Tensor amx_lora_linear(torch::Tensor x, torch::Tensor packed,
                              c10::optional<torch::Tensor> bias, bool gated,
                              torch::Tensor a_tiles, torch::Tensor b_tiles,
                              torch::Tensor token_slots, torch::Tensor scaling, int64_t rank,
                              std::vector<int64_t> out_slices) {
  const char* what = "amx_lora_linear";
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, what, ": x must be [M, K] with contiguous rows");
  TORCH_CHECK(packed.dim() == 5 && x.scalar_type() == at::kBFloat16, what,
              ": x bf16 and a packed weight");
  const int64_t M = x.size(0), K = x.size(1), nb = packed.size(0), kb = K / 32;
  const int64_t n_sub = int64_t(out_slices.size());
  TORCH_CHECK(rank >= 16 && rank % 16 == 0, what, ": rank must be a multiple of 16");
  TORCH_CHECK(n_sub >= 1, what, ": at least one sub-module");
  TORCH_CHECK(a_tiles.dim() == 5 && a_tiles.is_contiguous() &&
                  a_tiles.scalar_type() == at::kBFloat16 && a_tiles.size(1) == kb &&
                  a_tiles.size(2) == 16 && a_tiles.size(3) == 16 && a_tiles.size(4) == 2 &&
                  (a_tiles.size(0) * 16) % (n_sub * 32) == 0,
              what, ": a_tiles must be [n_sub * C / 16, K / 32, 16, 16, 2] bf16, C % 32 == 0");
  const int64_t C = a_tiles.size(0) * 16 / n_sub, cb = C / 32;
  std::vector<int64_t> h_column;  // per output block of 16: its sub-module's first column in h
  for (int64_t j = 0; j < n_sub; ++j) {
    TORCH_CHECK(out_slices[j] >= 16 && out_slices[j] % 16 == 0, what,
                ": every sub-module's outputs must be whole blocks of 16");
    h_column.insert(h_column.end(), out_slices[j] / 16, j * C);
  }
  TORCH_CHECK(int64_t(h_column.size()) == nb, what, ": out_slices must cover the weight's ",
              nb * 16, " outputs");
  TORCH_CHECK(b_tiles.dim() == 5 && b_tiles.is_contiguous() &&
                  b_tiles.scalar_type() == at::kBFloat16 && b_tiles.size(0) == cb &&
                  b_tiles.size(1) == nb && b_tiles.size(2) == 16 && b_tiles.size(3) == 16 &&
                  b_tiles.size(4) == 2,
              what, ": b_tiles must be [C / 32, N / 16, 16, 16, 2] bf16");
  TORCH_CHECK(token_slots.dim() == 1 && token_slots.size(0) == M &&
                  token_slots.scalar_type() == at::kInt && token_slots.is_contiguous(),
              what, ": token_slots must be [M] int32");
  TORCH_CHECK(scaling.dim() == 1 && scaling.scalar_type() == at::kFloat && scaling.is_contiguous(),
              what, ": scaling must be fp32");
  const int64_t slots_fit = std::min<int64_t>(C / rank, scaling.size(0));
  const int32_t* ts = token_slots.data_ptr<int32_t>();
  std::vector<char> used(slots_fit, 0);
  bool any = false;
  for (int64_t t = 0; t < M; ++t) {
    TORCH_CHECK(ts[t] >= -1 && ts[t] < slots_fit, what, ": token ", t, "'s slot ", ts[t],
                " is not one of the ", slots_fit, " slots");
    if (ts[t] >= 0) any = used[ts[t]] = 1;
  }
  if (!any) return run_linear(what, x, packed, bias, gated);
#if defined(SWITCHYARD_AMX)
  TORCH_CHECK(amx_permitted(), what, ": the OS does not lend this process the AMX tiles");
  LoraProducts plan;
  plan.ldh = n_sub * C;
  for (int64_t s = 0; s < slots_fit; ++s)  // ascending, each block once
    for (int64_t c = s * rank / 32; used[s] && c <= (s * rank + rank - 1) / 32; ++c)
      if (plan.blocks.empty() || plan.blocks.back() != c) plan.blocks.push_back(c);
  auto h = torch::zeros({M, plan.ldh}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* ap = reinterpret_cast<const uint16_t*>(a_tiles.data_ptr());
  auto* hp = h.data_ptr<c10::BFloat16>();
  const float* sc = scaling.data_ptr<float>();
  // Shrink tasks: one slot's rank rows of one sub-module, two 16-row blocks at a time.
  struct Task { int64_t sub, slot, row; };
  std::vector<Task> tasks;
  for (int64_t j = 0; j < n_sub; ++j)
    for (int64_t s = 0; s < slots_fit; ++s)
      for (int64_t i = 0; used[s] && i < rank; i += 32) tasks.push_back({j, s, i});
  const int64_t ldx = x.stride(0);
  at::parallel_for(0, int64_t(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    int configured = -1;
    for (int64_t i = begin; i < end; ++i) {
      const Task& task = tasks[i];
      // A's row, a block start, and h's column of its sums
      const int64_t row = task.sub * C + task.slot * rank + task.row;
      const uint16_t* a0 = ap + (row / 16) * kb * 512;
      const uint16_t* a1 = task.row + 16 < rank ? a0 + kb * 512 : nullptr;
      for (int64_t m0 = 0; m0 < M; m0 += 32) {
        const int64_t m_end = std::min(M, m0 + 32);
        if (std::find(ts + m0, ts + m_end, int32_t(task.slot)) == ts + m_end) continue;
        int rows0, rows1;
        configure_rows(m0, M, rows0, rows1, configured);
        shrink_slot(xp, ldx, m0, rows0, rows1, a0, a1, kb, ts, int32_t(task.slot),
                    sc[task.slot], hp, plan.ldh, row);
      }
    }
    if (configured >= 0) _tile_release();
  });
  plan.h = reinterpret_cast<const uint16_t*>(hp);
  plan.b = reinterpret_cast<const uint16_t*>(b_tiles.data_ptr());
  plan.h_column = std::move(h_column);
  return run_linear(what, x, packed, bias, gated, &plan);
#else
  TORCH_CHECK(false, what, ": built without the AMX tile instructions");
#endif
}
