// The LoRA terms of one linear for a CPU step (shard/layers/lora.py's native path):
//     y[t] += scaling[s] * B_s (A_s x[t])   for every token t with an adapter, s its slot,
// in one call per linear, over the slots' packed weights (lora.py's _Packed: for slot s and
// sub-module j, rank rows (s * n_sub + j) * rank + i of `a` [.., K] hold A_j; `b` is B in
// chunks (lora_chunks.py): per slot, per sub-module, its output columns in chunks of
// kExpandCols, each chunk's rank rows of kExpandCols values contiguous, zero past the last
// column. An expand task reads one chunk, so a slot's B streams from memory in order: read as
// rows of B^T, 128 bytes of each of rank rows kilobytes apart, it came at half the bandwidth
// the shrink gets (docs/benchmarks.md, twenty-third session).
//
// Why native: at a decode step's size (a few tokens a slot, rank 16) a term is tiny, and in
// torch it is five or six calls (casts, two GEMMs, the mask, the add) whose fixed costs are
// most of its time; with several slots the dense shape also multiplies every token by every
// slot. Here the tokens are grouped by slot (the step's `order` and `segments`, built once for
// all layers), each slot's A and B rows are read once for all its tokens, sums stay in fp32
// registers, and y is rounded once, as torch's fp32 path rounds it.
//
// Two schedules (apply): a step over many slots, none holding more than a thread's share of
// the tokens (a decode step over many adapters), gives each thread a run of whole slots
// (by_slot: one parallel region, each thread's bytes fetched ahead as one stream); a step over
// one or two slots splits each slot's rows over the threads, shrink then expand (by_rows).
// Tokens of a slot are independent of other slots', so both write every row of y from one
// thread only.
namespace {

constexpr int kTokenBlock = 4;       // tokens a register tile covers (with_group's limit)
constexpr int64_t kShrinkRows = 4;   // A rows a shrink tile covers
constexpr int64_t kTaskRows = 8;     // A rows a shrink task covers (a slot's rows split finely:
                                     // one slot's 3 x 16 q/k/v rows still feed both threads)
constexpr int64_t kExpandCols = 64;  // output columns an expand tile (and task) covers
constexpr int64_t kPrefetchRows = 12;  // how far ahead the shrink fetches A's rows
constexpr int64_t kPrefetchTasks = 8;  // how far ahead (in chunks) the expand fetches B

// Asks for n values from p on into the cache (a hint: it never faults, even past the end).
template <typename T>
inline void prefetch(const T* p, int64_t n) {
#if defined(__AVX512F__)
  const char* bytes = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * int64_t(sizeof(T)); b += 64) _mm_prefetch(bytes + b, _MM_HINT_T0);
#endif
}

// first[j]: sub-module j's first chunk among a slot's (B's layout, lora_chunks.py); first[n_sub]:
// a slot's chunks.
inline std::vector<int64_t> first_chunks(const std::vector<int64_t>& out_slices) {
  std::vector<int64_t> first(out_slices.size() + 1, 0);
  for (size_t j = 0; j < out_slices.size(); ++j)
    first[j + 1] = first[j] + (out_slices[j] + kExpandCols - 1) / kExpandCols;
  return first;
}

struct Segment {
  int64_t slot, begin, end;  // the slot's tokens: order[begin:end]
};

// h[t][r] = scale * <x[t], a[r]> for TB tokens (fp32 rows xs) and kShrinkRows rows of A (the
// first `rows` of them real; the others repeat the last real one and are not stored).
template <typename T, int TB>
inline void shrink_tile(const float* const* xs, const T* const* a, int64_t k_len, float scale,
                        float* const* h, int64_t rows) {
#if defined(__AVX512F__)
  __m512 acc[TB][kShrinkRows];
  SY_UNROLL
  for (int t = 0; t < TB; ++t)
    SY_UNROLL
    for (int64_t r = 0; r < kShrinkRows; ++r) acc[t][r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= k_len; k += 16) {
    __m512 av[kShrinkRows];
    SY_UNROLL
    for (int64_t r = 0; r < kShrinkRows; ++r) av[r] = load16(a[r] + k);
    SY_UNROLL
    for (int t = 0; t < TB; ++t) {
      const __m512 xv = _mm512_loadu_ps(xs[t] + k);
      SY_UNROLL
      for (int64_t r = 0; r < kShrinkRows; ++r) acc[t][r] = _mm512_fmadd_ps(xv, av[r], acc[t][r]);
    }
  }
  if (k < k_len) {
    const __mmask16 m = first_lanes(k_len - k);
    __m512 av[kShrinkRows];
    SY_UNROLL
    for (int64_t r = 0; r < kShrinkRows; ++r) av[r] = load16(a[r] + k, m);
    SY_UNROLL
    for (int t = 0; t < TB; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, xs[t] + k);
      SY_UNROLL
      for (int64_t r = 0; r < kShrinkRows; ++r) acc[t][r] = _mm512_fmadd_ps(xv, av[r], acc[t][r]);
    }
  }
  SY_UNROLL
  for (int t = 0; t < TB; ++t)
    SY_UNROLL
    for (int64_t r = 0; r < kShrinkRows; ++r)
      if (r < rows) h[t][r] = scale * _mm512_reduce_add_ps(acc[t][r]);
#else
  for (int t = 0; t < TB; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      float s = 0.f;
      for (int64_t k = 0; k < k_len; ++k) s += xs[t][k] * widen(a[r][k]);
      h[t][r] = scale * s;
    }
#endif
}

#if defined(__AVX512BF16__)
// shrink_tile for bf16 rows where the CPU has AVX512-BF16: vdpbf16ps multiplies pairs of bf16
// values into fp32 sums, 32 products an instruction against the fp32 path's 16, and reads x and
// A as they are (no widening). Products of two bf16 values are exact in fp32, as there.
template <int TB>
inline void shrink_tile_bf16(const c10::BFloat16* const* xs, const c10::BFloat16* const* a,
                             int64_t k_len, float scale, float* const* h, int64_t rows) {
  __m512 acc[TB][kShrinkRows];
  SY_UNROLL
  for (int t = 0; t < TB; ++t)
    SY_UNROLL
    for (int64_t r = 0; r < kShrinkRows; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_len; k += 32) {
    const int64_t left = std::min<int64_t>(32, k_len - k);
    const __mmask32 m = left == 32 ? ~__mmask32(0) : (__mmask32(1) << left) - 1;
    __m512bh av[kShrinkRows];
    SY_UNROLL
    for (int64_t r = 0; r < kShrinkRows; ++r)
      av[r] = (__m512bh)_mm512_maskz_loadu_epi16(m, a[r] + k);
    SY_UNROLL
    for (int t = 0; t < TB; ++t) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, xs[t] + k);
      SY_UNROLL
      for (int64_t r = 0; r < kShrinkRows; ++r) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], xv, av[r]);
    }
  }
  SY_UNROLL
  for (int t = 0; t < TB; ++t)
    SY_UNROLL
    for (int64_t r = 0; r < kShrinkRows; ++r)
      if (r < rows) h[t][r] = scale * _mm512_reduce_add_ps(acc[t][r]);
}
#endif

// y[t][c] += sum_i h[t][i] * b[i * b_stride + c] for TB tokens over `cols` (<= kExpandCols)
// columns, rounded once into y's type.
template <typename T, int TB>
inline void expand_tile(const float* const* h, int64_t rank, const T* b, int64_t b_stride,
                        int64_t cols, T* const* y) {
#if defined(__AVX512F__)
  constexpr int kVectors = kExpandCols / 16;
  __mmask16 m[kVectors];
  SY_UNROLL
  for (int c = 0; c < kVectors; ++c)
    m[c] = first_lanes(std::clamp<int64_t>(cols - 16 * c, 0, 16));
  __m512 acc[TB][kVectors];
  SY_UNROLL
  for (int t = 0; t < TB; ++t)
    SY_UNROLL
    for (int c = 0; c < kVectors; ++c) acc[t][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < rank; ++i) {
    const T* row = b + i * b_stride;
    __m512 bv[kVectors];
    SY_UNROLL
    for (int c = 0; c < kVectors; ++c) bv[c] = load16(row + 16 * c, m[c]);
    SY_UNROLL
    for (int t = 0; t < TB; ++t) {
      const __m512 hv = _mm512_set1_ps(h[t][i]);
      SY_UNROLL
      for (int c = 0; c < kVectors; ++c) acc[t][c] = _mm512_fmadd_ps(hv, bv[c], acc[t][c]);
    }
  }
  SY_UNROLL
  for (int t = 0; t < TB; ++t)
    SY_UNROLL
    for (int c = 0; c < kVectors; ++c) {
      T* out = y[t] + 16 * c;
      store16(out, _mm512_add_ps(load16(out, m[c]), acc[t][c]), m[c]);
    }
#else
  for (int t = 0; t < TB; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      float s = 0.f;
      for (int64_t i = 0; i < rank; ++i) s += h[t][i] * widen(b[i * b_stride + c]);
      y[t][c] = static_cast<T>(widen(y[t][c]) + s);
    }
#endif
}

// The bytes a thread will read, in the order it reads them, fetched a fixed distance ahead of
// its reads: the hardware's prefetcher loses the stream at each jump between a slot's A and its
// B, and a decode step's few tokens multiply a block in less time than a trip to memory.
class Stream {
 public:
  void add(const void* p, int64_t bytes) { ranges_.push_back({static_cast<const char*>(p), bytes}); }
  // Fetches the next `bytes` of the stream (called with what was just read, to keep the lead).
  void ahead(int64_t bytes) {
    while (bytes > 0 && i_ < ranges_.size()) {
      const auto& [p, size] = ranges_[i_];
      const int64_t n = std::min(bytes, size - off_);
      prefetch(p + off_, n);
      off_ += n;
      bytes -= n;
      if (off_ == size) ++i_, off_ = 0;
    }
  }

 private:
  std::vector<std::pair<const char*, int64_t>> ranges_;
  size_t i_ = 0;
  int64_t off_ = 0;
};

constexpr int64_t kStreamLead = 8192;   // bytes a thread fetches ahead of its reads
constexpr int64_t kExpandTokens = 16;   // a prompt's tokens expanded at a time (both schedules)
constexpr int64_t kShrinkTokens = 64;   // ... and shrunk at a time: their x rows stay in cache

// One call's operands and the pieces of work both schedules below are made of.
template <typename T>
struct Term {
  const T* x;  // [T, k_len], rows x_stride apart
  const T* a;  // the packed slots' A rows
  const T* b;  // the packed slots' B chunks
  T* y;
  const int64_t* order;
  const float* scaling;
  int64_t k_len, x_stride, y_stride, rank, slot_rows, chunk_values, slot_values;
  const float* xf;  // x's adapter tokens in slot order, widened (empty where kDots)

#if defined(__AVX512BF16__)
  static constexpr bool kDots = std::is_same_v<T, c10::BFloat16>;  // shrink_tile_bf16 reads x
#else
  static constexpr bool kDots = false;
#endif

  // h[u - seg.begin][r] for the segment's tokens [u0, u1) and rows [row, row_end) of its
  // slot; h holds slot_rows floats per token of the segment. `stream`: the thread's own
  // prefetch, else the fixed distances below.
  void shrink(const Segment& seg, int64_t u0, int64_t u1, int64_t row, int64_t row_end,
              float* h, Stream* stream = nullptr) const {
    const float scale = scaling[seg.slot];
    for (int64_t r = row; r < row_end; r += kShrinkRows) {
      const int64_t rows = std::min(kShrinkRows, row_end - r);
      const T* a_rows[kShrinkRows];
      for (int64_t j = 0; j < kShrinkRows; ++j)
        a_rows[j] = a + (seg.slot * slot_rows + r + std::min(j, rows - 1)) * k_len;
      // Rows kPrefetchRows on in memory (this slot's, or the next slot's) are fetched while
      // these are multiplied: a slot's rows come from memory, not cache, and a block's
      // multiply at a decode step's few tokens is shorter than a trip to memory.
      if (stream != nullptr) {
        stream->ahead(rows * k_len * int64_t(sizeof(T)));
      } else {
        prefetch(a_rows[0] + kPrefetchRows * k_len, kShrinkRows * k_len);
      }
      for (int64_t u = u0; u < u1; u += kTokenBlock) {
        const int64_t tb = std::min<int64_t>(kTokenBlock, u1 - u);
        float* hs[kTokenBlock];
        for (int64_t t = 0; t < tb; ++t) hs[t] = h + (u - seg.begin + t) * slot_rows + r;
#if defined(__AVX512BF16__)
        if constexpr (kDots) {
          const T* xs[kTokenBlock];
          for (int64_t t = 0; t < tb; ++t) xs[t] = x + order[u + t] * x_stride;
          with_group<kTokenBlock>(tb, [&](auto n) {
            shrink_tile_bf16<decltype(n)::value>(xs, a_rows, k_len, scale, hs, rows);
          });
          continue;
        }
#endif
        const float* xs[kTokenBlock];
        for (int64_t t = 0; t < tb; ++t) xs[t] = xf + (u + t) * k_len;
        with_group<kTokenBlock>(tb, [&](auto n) {
          shrink_tile<T, decltype(n)::value>(xs, a_rows, k_len, scale, hs, rows);
        });
      }
    }
  }

  // y's columns [col, col + cols) of sub-module `sub` for the segment's tokens [u0, u1), from
  // B chunk `chunk` of its slot and h as `shrink` left it. `stream`: fetch ahead of this read.
  void expand(const Segment& seg, int64_t u0, int64_t u1, int64_t sub, int64_t col,
              int64_t cols, int64_t chunk, const float* h, Stream* stream = nullptr) const {
    const T* values = b + seg.slot * slot_values + chunk * chunk_values;
    // The chunk kPrefetchTasks on (next in memory: this slot's, the next slot's, or past the
    // end, a hint).
    if (stream != nullptr)
      stream->ahead(chunk_values * int64_t(sizeof(T)));
    else
      prefetch(values + kPrefetchTasks * chunk_values, chunk_values);
    for (int64_t u = u0; u < u1; u += kTokenBlock) {
      const int64_t tb = std::min<int64_t>(kTokenBlock, u1 - u);
      const float* hs[kTokenBlock];
      T* ys[kTokenBlock];
      for (int64_t t = 0; t < tb; ++t) {
        hs[t] = h + (u - seg.begin + t) * slot_rows + sub * rank;
        ys[t] = y + order[u + t] * y_stride + col;
      }
      with_group<kTokenBlock>(tb, [&](auto n) {
        expand_tile<T, decltype(n)::value>(hs, rank, values, kExpandCols, cols, ys);
      });
    }
  }
};

struct Chunk {
  int64_t sub, col, cols, chunk;  // sub-module, its first output column, width, B chunk
};

// A slot's expand chunks: kExpandCols output columns of one sub-module each, in B's order.
inline std::vector<Chunk> slot_chunks(const std::vector<int64_t>& out_slices) {
  const std::vector<int64_t> first = first_chunks(out_slices);
  std::vector<Chunk> chunks;
  for (int64_t j = 0, offset = 0; j < int64_t(out_slices.size()); offset += out_slices[j], ++j)
    for (int64_t c = 0; c < out_slices[j]; c += kExpandCols)
      chunks.push_back({j, offset + c, std::min(kExpandCols, out_slices[j] - c),
                        first[j] + c / kExpandCols});
  return chunks;
}

// Whether the step's slots are many enough, and evenly enough used, that each thread can take
// whole slots (`by_slot`): every thread then has a slot's A and B to stream, and a call needs
// one parallel region, not two.
inline bool slots_feed_threads(const std::vector<Segment>& segments, int64_t tokens) {
  const int64_t threads = at::get_num_threads(), groups = int64_t(segments.size());
  if (threads < 2 || groups < 2 * threads) return false;
  int64_t largest = 0;
  for (const Segment& seg : segments) largest = std::max(largest, seg.end - seg.begin);
  return largest * threads <= tokens;  // no one slot's tokens outweigh a thread's share
}

// Each thread takes a run of consecutive slots of about equal cost (a slot's weights count as
// two tokens' arithmetic): for each, its shrink into the thread's own h, then its expand, while
// the slot's rows are fresh. Tokens belong to one slot each, so no two threads write one row of y.
template <typename T>
void by_slot(const Term<T>& term, const std::vector<Segment>& segments,
             const std::vector<Chunk>& chunks) {
  const int64_t groups = int64_t(segments.size()), threads = at::get_num_threads();
  std::vector<int64_t> cost(groups + 1, 0);
  for (int64_t g = 0; g < groups; ++g)
    cost[g + 1] = cost[g] + 2 + segments[g].end - segments[g].begin;
  std::vector<int64_t> cut(threads + 1, groups);
  for (int64_t w = 0, g = 0; w < threads; ++w) {
    while (g < groups && cost[g] * threads < cost[groups] * w) ++g;
    cut[w] = g;
  }
  const int64_t a_bytes = term.slot_rows * term.k_len * int64_t(sizeof(T));
  const int64_t b_bytes = term.slot_values * int64_t(sizeof(T));
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> h;
    for (int64_t w = begin; w < end; ++w) {
      Stream stream;
      for (int64_t g = cut[w]; g < cut[w + 1]; ++g) {
        stream.add(term.a + segments[g].slot * term.slot_rows * term.k_len, a_bytes);
        stream.add(term.b + segments[g].slot * term.slot_values, b_bytes);
      }
      stream.ahead(kStreamLead);
      for (int64_t g = cut[w]; g < cut[w + 1]; ++g) {
        const Segment& seg = segments[g];
        h.resize((seg.end - seg.begin) * term.slot_rows);
        for (int64_t u = seg.begin; u < seg.end; u += kShrinkTokens)
          term.shrink(seg, u, std::min(u + kShrinkTokens, seg.end), 0, term.slot_rows, h.data(),
                      u == seg.begin ? &stream : nullptr);
        // A prompt's tokens go kExpandTokens at a time through all of the slot's chunks
        // (which stay in cache), so that their rows of y are written while in cache, not in
        // one pass per chunk over every token's row (2,048 tokens: twice the time a token).
        for (int64_t u = seg.begin; u < seg.end; u += kExpandTokens) {
          const int64_t u1 = std::min(u + kExpandTokens, seg.end);
          for (const Chunk& c : chunks)
            term.expand(seg, u, u1, c.sub, c.col, c.cols, c.chunk, h.data(),
                        u == seg.begin ? &stream : nullptr);
        }
      }
    }
  });
}

// Shrink, then expand, each split finely over the threads: for a step whose tokens use one or
// two slots (a decode step on one adapter, a prompt), whose rows alone must feed every thread.
template <typename T>
void by_rows(const Term<T>& term, const std::vector<Segment>& segments,
             const std::vector<Chunk>& chunks, float* h) {
  // Shrink: tasks of kTaskRows rows of one slot, for up to kShrinkTokens of its tokens.
  struct ShrinkTask { int64_t seg, u, row; };
  std::vector<ShrinkTask> shrink;
  for (int64_t g = 0; g < int64_t(segments.size()); ++g)
    for (int64_t u = segments[g].begin; u < segments[g].end; u += kShrinkTokens)
      for (int64_t r = 0; r < term.slot_rows; r += kTaskRows) shrink.push_back({g, u, r});
  // Expand: tasks of one chunk for up to kExpandTokens of one slot's tokens, token blocks
  // outermost (as by_slot goes, for the same reason).
  struct ExpandTask { int64_t seg, u; const Chunk* c; };
  std::vector<ExpandTask> expand;
  for (int64_t g = 0; g < int64_t(segments.size()); ++g)
    for (int64_t u = segments[g].begin; u < segments[g].end; u += kExpandTokens)
      for (const Chunk& c : chunks) expand.push_back({g, u, &c});
  const int64_t n_shrink = int64_t(shrink.size()), n_expand = int64_t(expand.size());
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n_expand));
  const int64_t expand_share = (n_expand + threads - 1) / threads;
  const int64_t row_bytes = term.k_len * int64_t(sizeof(T));
  const int64_t chunk_bytes = term.chunk_values * int64_t(sizeof(T));
  at::parallel_for(0, n_shrink, 1, [&](int64_t begin, int64_t end) {
    // This thread's A rows, then the B chunks it will likely expand (at::parallel_for hands
    // thread i the i-th even share of a range), fetched as one stream: the expand then finds
    // its chunks in cache, fetched while the shrink multiplied.
    Stream stream;
    for (int64_t i = begin; i < end; ++i) {
      if (shrink[i].u != segments[shrink[i].seg].begin) continue;  // rows fetched once
      const int64_t row = segments[shrink[i].seg].slot * term.slot_rows + shrink[i].row;
      const int64_t rows = std::min(kTaskRows, term.slot_rows - shrink[i].row);
      stream.add(term.a + row * term.k_len, rows * row_bytes);
    }
    const int64_t first = at::get_thread_num() * expand_share;
    for (int64_t i = first; i < std::min(first + expand_share, n_expand); ++i) {
      const ExpandTask& task = expand[i];
      if (task.u != segments[task.seg].begin) continue;  // a chunk fetched once
      stream.add(term.b + segments[task.seg].slot * term.slot_values +
                     task.c->chunk * term.chunk_values, chunk_bytes);
    }
    stream.ahead(kStreamLead);
    for (int64_t i = begin; i < end; ++i) {
      const Segment& seg = segments[shrink[i].seg];
      const int64_t u = shrink[i].u, row_end = std::min(shrink[i].row + kTaskRows, term.slot_rows);
      term.shrink(seg, u, std::min(u + kShrinkTokens, seg.end), shrink[i].row, row_end,
                  h + seg.begin * term.slot_rows, u == seg.begin ? &stream : nullptr);
    }
    stream.ahead(std::numeric_limits<int64_t>::max());  // the rest of the chunks
  });
  at::parallel_for(0, n_expand, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Segment& seg = segments[expand[i].seg];
      const Chunk& c = *expand[i].c;
      term.expand(seg, expand[i].u, std::min(expand[i].u + kExpandTokens, seg.end), c.sub,
                  c.col, c.cols, c.chunk, h + seg.begin * term.slot_rows);
    }
  });
}

template <typename T>
void apply(const at::Tensor& x, at::Tensor& y, const at::Tensor& a, const at::Tensor& b,
           const int64_t* order, const std::vector<Segment>& segments, const float* scaling,
           int64_t rank, const std::vector<int64_t>& out_slices) {
  const int64_t k_len = x.size(1), slot_rows = int64_t(out_slices.size()) * rank;
  const int64_t tokens = segments.empty() ? 0 : segments.back().end;
  const int64_t chunk_values = rank * kExpandCols;
  Term<T> term{x.data_ptr<T>(), a.data_ptr<T>(), b.data_ptr<T>(), y.data_ptr<T>(), order,
               scaling, k_len, x.stride(0), y.stride(0), rank, slot_rows, chunk_values,
               first_chunks(out_slices).back() * chunk_values, nullptr};
  // Without bf16 dot products, the step's adapter tokens in slot order, widened once (every
  // A row block reads them).
  std::vector<float> xf(Term<T>::kDots ? 0 : tokens * k_len);
  for (int64_t u = 0; !Term<T>::kDots && u < tokens; ++u) {
    const T* row = term.x + order[u] * term.x_stride;
    for (int64_t k = 0; k < k_len; ++k) xf[u * k_len + k] = widen(row[k]);
  }
  term.xf = xf.data();
  const std::vector<Chunk> chunks = slot_chunks(out_slices);
  if (slots_feed_threads(segments, tokens)) {
    by_slot(term, segments, chunks);
    return;
  }
  std::vector<float> h(tokens * slot_rows);
  by_rows(term, segments, chunks, h.data());
}

}  // namespace

// y [T, N] += each adapter token's LoRA term. x [T, K]; a [S * n_sub * rank, K] and
// b [S * C * rank, kExpandCols] the packed slots (sum(out_slices) == N, C the chunks of a slot:
// the sum over sub-modules of ceil(out_slices[j] / kExpandCols)); order [U] int64: token
// indices grouped by slot; segments [G, 3] int64: (slot, begin, end) of each group in order,
// consecutive from 0 to U; scaling [>= S] fp32. x, y, a and b share one dtype (fp32, bf16,
// fp16); a token appears at most once; tokens not in order are left alone.
void lora_apply(const at::Tensor& x, at::Tensor& y, const at::Tensor& a, const at::Tensor& b,
                const at::Tensor& order, const at::Tensor& segments, const at::Tensor& scaling,
                int64_t rank, std::vector<int64_t> out_slices) {
  TORCH_CHECK(x.dim() == 2 && y.dim() == 2 && x.size(0) == y.size(0), "x [T, K] and y [T, N]");
  TORCH_CHECK(x.stride(1) == 1 && y.stride(1) == 1, "x's and y's rows must be contiguous");
  TORCH_CHECK(x.scalar_type() == y.scalar_type() && a.scalar_type() == x.scalar_type() &&
                  b.scalar_type() == x.scalar_type(),
              "x, y, a and b must share a dtype");
  TORCH_CHECK(rank >= 1 && !out_slices.empty(), "rank >= 1 and at least one sub-module");
  int64_t n_out = 0;
  for (int64_t n : out_slices) {
    TORCH_CHECK(n >= 1, "every sub-module needs an output feature");
    n_out += n;
  }
  const int64_t n_sub = int64_t(out_slices.size()), slot_rows = n_sub * rank;
  TORCH_CHECK(n_out == y.size(1), "out_slices must cover y's columns");
  TORCH_CHECK(a.dim() == 2 && a.is_contiguous() && a.size(1) == x.size(1),
              "a: [rows, K], contiguous, K x's width");
  TORCH_CHECK(a.size(0) % slot_rows == 0, "a: n_sub * rank rows per slot");
  const int64_t slots = a.size(0) / slot_rows;
  const int64_t chunks = first_chunks(out_slices).back();
  TORCH_CHECK(b.dim() == 2 && b.is_contiguous() && b.size(1) == kExpandCols &&
                  b.size(0) == slots * chunks * rank,
              "b: [slots * chunks * rank, ", kExpandCols, "] (B in column chunks), contiguous");
  TORCH_CHECK(order.dim() == 1 && order.scalar_type() == at::kLong && order.is_contiguous(),
              "order: 1-D int64");
  TORCH_CHECK(segments.dim() == 2 && segments.size(1) == 3 &&
                  segments.scalar_type() == at::kLong && segments.is_contiguous(),
              "segments: [G, 3] int64");
  TORCH_CHECK(scaling.dim() == 1 && scaling.scalar_type() == at::kFloat &&
                  scaling.is_contiguous() && scaling.size(0) >= slots,
              "scaling: fp32, one per slot");
  // Every index is checked before anything is read or written: a bad plan never reaches
  // memory outside the tensors, and no token's row is written by two tasks at once.
  const int64_t* op = order.data_ptr<int64_t>();
  std::vector<char> seen(x.size(0), 0);
  for (int64_t u = 0; u < order.size(0); ++u) {
    TORCH_CHECK(op[u] >= 0 && op[u] < x.size(0), "order[", u, "] = ", op[u], " is not a token");
    TORCH_CHECK(!seen[op[u]], "token ", op[u], " appears twice in order");
    seen[op[u]] = 1;
  }
  std::vector<Segment> plan;
  const int64_t* sp = segments.data_ptr<int64_t>();
  for (int64_t g = 0, expect = 0; g < segments.size(0); ++g) {
    const Segment seg{sp[3 * g], sp[3 * g + 1], sp[3 * g + 2]};
    TORCH_CHECK(seg.slot >= 0 && seg.slot < slots, "segment ", g, ": slot ", seg.slot,
                " is not one of the ", slots, " slots");
    TORCH_CHECK(seg.begin == expect && seg.end > seg.begin && seg.end <= order.size(0),
                "segment ", g, ": [", seg.begin, ", ", seg.end, ") does not continue at ", expect);
    expect = seg.end;
    plan.push_back(seg);
  }
  TORCH_CHECK(plan.empty() ? order.size(0) == 0 : plan.back().end == order.size(0),
              "segments must cover order");
  const float* scale = scaling.data_ptr<float>();
  with_dtype(x.scalar_type(), "lora_apply", [&](auto tag) {
    apply<decltype(tag)>(x, y, a, b, op, plan, scale, rank, out_slices);
  });
}
