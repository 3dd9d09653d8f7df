// A Mixture-of-Experts layer's SwiGLU experts over a step of few rows per expert (a decode or
// verify step's), in one call: routing's pairs sorted by expert, every expert's gate_up GEMM with
// the activation, its down GEMM, and each token's weighted sum (shard/platforms/grouped_moe.py
// computes the same with torch ops, and is the contract). Where the CPU has AVX2 but no
// half-precision dot products, with the rows kernel of rows_gemm.cpp.
//
// Why one call, and why split by columns: at 16 experts a layer, one GEMM region per expert and
// projection is 32 OpenMP regions a layer, and the thread that finishes first waits at each
// one's barrier; the torch ops around them (sort, gather, weight, index_add) cost as much again.
// Here each thread takes a slice of the intermediate columns of every expert (gate, up and the
// activation together), then a slice of the hidden columns of every expert: two regions a layer,
// each thread reading an equal share of every expert's weights.
#if defined(__x86_64__)

namespace {

// Pairs (token, choice) of the step sorted by expert, stably: expert e's rows are
// [first[e], first[e + 1]) of token/weight, in the order of the flattened [T, K] choices.
struct ExpertRows {
  std::vector<int64_t> first;
  std::vector<int64_t> token;
  std::vector<float> weight;
  int64_t widest = 0;
};

ExpertRows sort_by_expert(const int32_t* ids, const float* weights, int64_t pairs, int64_t k,
                          int64_t experts) {
  ExpertRows rows;
  rows.first.assign(experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = ids[p];
    TORCH_CHECK(e >= -1 && e < experts, "rows_moe: expert id ", e, " is outside [-1, ", experts,
                ")");
    if (e >= 0) ++rows.first[e + 1];
  }
  for (int64_t e = 0; e < experts; ++e) {
    rows.widest = std::max(rows.widest, rows.first[e + 1]);
    rows.first[e + 1] += rows.first[e];
  }
  rows.token.resize(rows.first[experts]);
  rows.weight.resize(rows.first[experts]);
  std::vector<int64_t> next(rows.first.begin(), rows.first.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) {
    if (ids[p] < 0) continue;  // another rank's expert (expert parallel)
    const int64_t at = next[ids[p]]++;
    rows.token[at] = p / k;
    rows.weight[at] = weights[p];
  }
  return rows;
}

// Column blocks of 8 (the rows kernel's register tile width) split across the threads.
template <typename F>
void parallel_columns(int64_t columns, F&& f) {
  const int64_t blocks = (columns + 7) / 8;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    f(b0 * 8, std::min(columns, b1 * 8));
  });
}

template <typename T>
void moe_experts(const T* x, int64_t hidden, const ExpertRows& rows, const T* w13,
                 const int64_t* ld13, const T* w2, const int64_t* ld2, int64_t inter, T* out) {
  // ld13, ld2: the weights' expert and row strides
  const int64_t experts = static_cast<int64_t>(rows.first.size()) - 1;
  const int64_t pairs = rows.first[experts];
  std::vector<float> xg(pairs * hidden), h(pairs * inter);
  for (int64_t p = 0; p < pairs; ++p) {
    const T* src = x + rows.token[p] * hidden;
    for (int64_t i = 0; i < hidden; ++i) xg[p * hidden + i] = widen(src[i]);
  }
  // gate and up columns [j0, j1) of every expert, rounded to T (a half-precision linear's
  // result), through silu_mul (elementwise.cpp's, its roundings) into h as fp32
  parallel_columns(inter, [&](int64_t j0, int64_t j1) {
    const int64_t width = j1 - j0;
    std::vector<float> gate(rows.widest * width), up(rows.widest * width);
    std::vector<T> gate_t(width), up_t(width), gated(width);
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t start = rows.first[e], count = rows.first[e + 1] - start;
      if (count == 0) continue;
      const T* w = w13 + e * ld13[0];
      rows_range(xg.data() + start * hidden, count, hidden, w + j0 * ld13[1], ld13[1], 0, width,
                 gate.data(), width);
      rows_range(xg.data() + start * hidden, count, hidden, w + (inter + j0) * ld13[1], ld13[1],
                 0, width, up.data(), width);
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t j = 0; j < width; ++j) {
          gate_t[j] = static_cast<T>(gate[r * width + j]);
          up_t[j] = static_cast<T>(up[r * width + j]);
        }
        silu_mul_row<T>(gate_t.data(), up_t.data(), gated.data(), width);
        float* dst = h.data() + (start + r) * inter + j0;
        for (int64_t j = 0; j < width; ++j) dst[j] = widen(gated[j]);
      }
    }
  });
  // hidden columns [n0, n1) of every expert's down projection, rounded to T, weighted (in fp32,
  // rounded) and added into the token's row, expert by expert in ascending order with a rounding
  // per add: what transformers' expert loop computes with index_add_ in the model's dtype
  parallel_columns(hidden, [&](int64_t n0, int64_t n1) {
    const int64_t width = n1 - n0;
    std::vector<float> down(rows.widest * width);
    for (int64_t e = 0; e < experts; ++e) {
      const int64_t start = rows.first[e], count = rows.first[e + 1] - start;
      if (count == 0) continue;
      rows_range(h.data() + start * inter, count, inter, w2 + e * ld2[0] + n0 * ld2[1], ld2[1],
                 0, width, down.data(), width);
      for (int64_t r = 0; r < count; ++r) {
        const float weight = rows.weight[start + r];
        T* dst = out + rows.token[start + r] * hidden + n0;
        for (int64_t j = 0; j < width; ++j) {
          const float term = round_to<T>(round_to<T>(down[r * width + j]) * weight);
          dst[j] = static_cast<T>(widen(dst[j]) + term);
        }
      }
    }
  });
}

}  // namespace

// x [T, H] bf16 or fp16, topk_ids [T, K] int32 (-1: an expert another rank holds, skipped),
// topk_weights [T, K] float32, w13 [E, 2I, H] (gate rows, then up) and w2 [E, H, I] in x's dtype
// with contiguous rows -> [T, H] in x's dtype: sum over k of weight * w2[e] @ silu(gate) * up, as
// shard/platforms/grouped_moe.py computes it; None where an expert has more than max_rows rows
// (the rows kernel's reach: the caller's grouped GEMMs take those steps).
std::optional<torch::Tensor> rows_moe(torch::Tensor x, torch::Tensor topk_ids,
                                      torch::Tensor topk_weights, torch::Tensor w13,
                                      torch::Tensor w2, int64_t max_rows) {
  TORCH_CHECK(x.dim() == 2 && w13.dim() == 3 && w2.dim() == 3,
              "rows_moe: x must be [T, H], w13 [E, 2I, H] and w2 [E, H, I]");
  TORCH_CHECK(x.scalar_type() == w13.scalar_type() && w13.scalar_type() == w2.scalar_type(),
              "rows_moe: x and the weights must share a dtype");
  TORCH_CHECK(w13.stride(2) == 1 && w2.stride(2) == 1, "rows_moe: rows must be contiguous");
  const int64_t tokens = x.size(0), hidden = x.size(1), experts = w13.size(0);
  const int64_t inter = w2.size(2);
  TORCH_CHECK(w13.size(1) == 2 * inter && w13.size(2) == hidden && w2.size(0) == experts &&
                  w2.size(1) == hidden,
              "rows_moe: w13 must be [E, 2I, H] and w2 [E, H, I]");
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.size(0) == tokens &&
                  topk_ids.scalar_type() == at::kInt && topk_weights.sizes() == topk_ids.sizes() &&
                  topk_weights.scalar_type() == at::kFloat,
              "rows_moe: topk_ids must be [T, K] int32 and topk_weights [T, K] float32");
  const auto ids = topk_ids.contiguous();
  const auto weights = topk_weights.contiguous();
  const auto rows = sort_by_expert(ids.data_ptr<int32_t>(), weights.data_ptr<float>(),
                                   ids.numel(), ids.size(1), experts);
  if (rows.widest > max_rows) return std::nullopt;
  const auto xc = x.contiguous();
  auto out = torch::zeros({tokens, hidden}, x.options());
  with_half_dtype(w13, "rows_moe", [&](auto zero) {
    using T = decltype(zero);
    moe_experts(reinterpret_cast<const T*>(xc.data_ptr()), hidden, rows,
                reinterpret_cast<const T*>(w13.data_ptr()), w13.strides().data(),
                reinterpret_cast<const T*>(w2.data_ptr()), w2.strides().data(), inter,
                reinterpret_cast<T*>(out.data_ptr()));
  });
  return out;
}
#else
std::optional<torch::Tensor> rows_moe(torch::Tensor x, torch::Tensor topk_ids,
                                      torch::Tensor topk_weights, torch::Tensor w13,
                                      torch::Tensor w2, int64_t max_rows) {
  TORCH_CHECK(false, "rows_moe: built only for x86-64 (AVX2 and FMA)");
}
#endif
