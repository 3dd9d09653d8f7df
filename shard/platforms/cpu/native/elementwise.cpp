// A decoder layer's elementwise steps on the CPU, one pass each, for the eager path
// (shard/layers/norm.py, rotary.py, activation.py; under --compile inductor fuses the torch
// forms itself and these are not called):
//   rms_norm:  out = w * round(x * rsqrt(mean(x^2) + eps))            (Llama's RMSNorm)
//   add_rms_norm: s = round(x + r), out = rms_norm(s)       (the residual add before a norm)
//   silu_mul:  out = round(g / (1 + e^-g)) * u                         (SwiGLU's gate)
//   rotary:    out = round(x * c) + round(swap_halves(x) * s)          (neox rotation; over
//              the tables' width, the head's leading dims, the rest copied: partial rotary)
// where round() is a rounding to the tensors' dtype, made where torch's forms make it, and every
// result is rounded once to the dtype as torch rounds it.
//
// Why native: in eager torch, RMSNorm is six ops over an fp32 copy of its input, rotary five and
// SiLU-and-mul two. A 2,048-token prefill of the SmolLM2 shape spent ~260 of ~500 ms in them
// (one pass over memory per op, and the fp32 temporaries), a 16-row decode step a few ms (each
// op's fixed cost). Each kernel here reads its inputs once and writes its output once. Rotary
// computes torch's form bit for bit; RMSNorm and SiLU differ from it only in fp32's last bit of
// one intermediate (the order of a sum; exp), which rounding to bf16 almost always hides.
namespace {

constexpr int64_t kMaxHeadDim = 512;  // rotary's per-token tables live on the stack

// Rows a parallel task takes: ~16K values at least, so that a decode step's few rows run on the
// calling thread (opening a parallel region costs more than their work).
inline int64_t grain_rows(int64_t row_len) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_len));
}

// Row r of a [R, n] or [A, B, n] tensor with contiguous rows: R = A * B rows, r = a * B + b.
struct Rows {
  int64_t inner, stride_outer, stride_inner;
  int64_t offset(int64_t r) const { return (r / inner) * stride_outer + (r % inner) * stride_inner; }
};

Rows rows_of(const torch::Tensor& x) {
  if (x.dim() == 3) return {x.size(1), x.stride(0), x.stride(1)};
  return {1, x.stride(0), 0};
}

template <typename T>
void rms_norm_row(const T* x, const T* w, T* out, int64_t n, float eps) {
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = load16(x + i), b = load16(x + i + 16);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
    acc1 = _mm512_fmadd_ps(b, b, acc1);
  }
  for (; i < n; i += 16) {
    const __m512 a = load16(x + i, first_lanes(std::min<int64_t>(16, n - i)));
    acc0 = _mm512_fmadd_ps(a, a, acc0);
  }
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(sum / float(n) + eps));
  for (i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(std::min<int64_t>(16, n - i));
    const __m512 normed = round_to<T>(_mm512_mul_ps(load16(x + i, m), inv));
    store16(out + i, _mm512_mul_ps(load16(w + i, m), normed), m);
  }
#else
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum += widen(x[i]) * widen(x[i]);
  const float inv = 1.0f / std::sqrt(sum / float(n) + eps);
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<T>(widen(w[i]) * round_to<T>(widen(x[i]) * inv));
#endif
}

// s = x + r rounded to T, as torch's add rounds it.
template <typename T>
void add_row(const T* x, const T* r, T* s, int64_t n) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(std::min<int64_t>(16, n - i));
    store16(s + i, _mm512_add_ps(load16(x + i, m), load16(r + i, m)), m);
  }
#else
  for (int64_t i = 0; i < n; ++i) s[i] = static_cast<T>(widen(x[i]) + widen(r[i]));
#endif
}

template <typename T>
void silu_mul_row(const T* g, const T* u, T* out, int64_t n) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes(std::min<int64_t>(16, n - i));
    store16(out + i, silu_times16<T>(load16(g + i, m), load16(u + i, m)), m);
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    const float gv = widen(g[i]);
    out[i] = static_cast<T>(round_to<T>(gv / (1.f + std::exp(-gv))) * widen(u[i]));
  }
#endif
}

// One token's heads of d values: over the first r (the rotated width, even, <= d),
// out[i] = round(x[i] c[i]) + round(x[i ± r/2] s[i]) (the partner is in the other half), c and s
// already rounded to T; values r..d-1 are copied as they are (partial rotary passes them through).
template <typename T>
void rotary_token(const T* x, int64_t heads, int64_t d, int64_t r, const float* c, const float* s,
                  T* out) {
  const int64_t half = r / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const T* xh = x + h * d;
    T* oh = out + h * d;
    if (r < d) std::memcpy(oh + r, xh + r, (d - r) * sizeof(T));
    for (int64_t lo : {int64_t(0), half}) {
      const int64_t partner = lo == 0 ? half : -half;
#if defined(__AVX512F__)
      for (int64_t i = lo; i < lo + half; i += 16) {
        const __mmask16 m = first_lanes(std::min<int64_t>(16, lo + half - i));
        const __m512 a = round_to<T>(_mm512_mul_ps(load16(xh + i, m), load16(c + i, m)));
        const __m512 b = round_to<T>(_mm512_mul_ps(load16(xh + i + partner, m), load16(s + i, m)));
        store16(oh + i, _mm512_add_ps(a, b), m);
      }
#else
      for (int64_t i = lo; i < lo + half; ++i)
        oh[i] = static_cast<T>(round_to<T>(widen(xh[i]) * c[i]) +
                               round_to<T>(widen(xh[i + partner]) * s[i]));
#endif
    }
  }
}

// The norm's weight [n] (n: x's last size), contiguous, in x's dtype; eps >= 0.
void check_norm_weight(const char* what, const torch::Tensor& x, const torch::Tensor& weight,
                       double eps) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == n && weight.is_contiguous(), what,
              ": weight must be [", n, "] and contiguous");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), what, ": weight and x differ in dtype");
  TORCH_CHECK(eps >= 0, what, ": eps must be >= 0");
}

}  // namespace

// x [R, n] or [A, B, n] (rows contiguous, any row strides), weight [n], one dtype -> [.., n].
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "rms_norm: x must be [R, n] or [A, B, n]");
  const int64_t n = x.size(-1);
  TORCH_CHECK(x.stride(-1) == 1, "rms_norm: x's rows must be contiguous");
  check_norm_weight("rms_norm", x, weight, eps);
  auto out = torch::empty(x.sizes(), x.options());
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const Rows in = rows_of(x);
  with_dtype(x.scalar_type(), "rms_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data_ptr<T>();
    const T* wp = weight.data_ptr<T>();
    T* op = out.data_ptr<T>();
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        rms_norm_row(xp + in.offset(r), wp, op + r * n, n, float(eps));
    });
  });
  return out;
}

// x, residual [R, n] (rows contiguous), weight [n], one dtype -> (rms_norm(s), s) with
// s = x + residual: a decoder layer's residual add and the norm after it in one pass over the
// rows (the sum is still in L1 when the norm reads it), and one call where torch takes two.
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor residual,
                                                      torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.sizes() == residual.sizes(), "add_rms_norm: x and residual [R, n]");
  TORCH_CHECK(x.stride(1) == 1 && residual.stride(1) == 1, "add_rms_norm: rows must be contiguous");
  TORCH_CHECK(residual.scalar_type() == x.scalar_type(), "add_rms_norm: x and residual differ in dtype");
  const int64_t n = x.size(1);
  check_norm_weight("add_rms_norm", x, weight, eps);
  auto out = torch::empty(x.sizes(), x.options());
  auto sum = torch::empty(x.sizes(), x.options());
  with_dtype(x.scalar_type(), "add_rms_norm", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data_ptr<T>();
    const T* rp = residual.data_ptr<T>();
    const T* wp = weight.data_ptr<T>();
    T* op = out.data_ptr<T>();
    T* sp = sum.data_ptr<T>();
    const int64_t xs = x.stride(0), rs = residual.stride(0);
    at::parallel_for(0, x.size(0), grain_rows(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        add_row(xp + r * xs, rp + r * rs, sp + r * n, n);
        rms_norm_row(sp + r * n, wp, op + r * n, n, float(eps));
      }
    });
  });
  return {out, sum};
}

// gate, up [R, n] (rows contiguous, e.g. the two halves of a gate_up product), one dtype ->
// silu(gate) * up [R, n].
torch::Tensor silu_mul(torch::Tensor gate, torch::Tensor up) {
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes(), "silu_mul: gate and up [R, n]");
  TORCH_CHECK(gate.stride(1) == 1 && up.stride(1) == 1, "silu_mul: rows must be contiguous");
  TORCH_CHECK(gate.scalar_type() == up.scalar_type(), "silu_mul: gate and up differ in dtype");
  auto out = torch::empty(gate.sizes(), gate.options());
  const int64_t rows = gate.size(0), n = gate.size(1);
  with_dtype(gate.scalar_type(), "silu_mul", [&](auto tag) {
    using T = decltype(tag);
    const T* gp = gate.data_ptr<T>();
    const T* up_ = up.data_ptr<T>();
    T* op = out.data_ptr<T>();
    at::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        silu_mul_row(gp + r * gate.stride(0), up_ + r * up.stride(0), op + r * n, n);
    });
  });
  return out;
}

// x [T, H, D] (each row's heads contiguous, any row stride), cos and sin [P, R] float32 (tables
// over the rotated width R, even and <= D: rotary.py's, sin negated in the first half; R < D
// for partial rotary, whose other dims are copied), positions [T] int64 in [0, P) (the tables'
// rows: longrope's long rows follow its short ones) -> the rotated x [T, H, D].
torch::Tensor rotary(torch::Tensor x, torch::Tensor cos, torch::Tensor sin,
                     torch::Tensor positions) {
  TORCH_CHECK(x.dim() == 3, "rotary: x must be [T, H, D]");
  const int64_t tokens = x.size(0), heads = x.size(1), d = x.size(2);
  TORCH_CHECK(d <= kMaxHeadDim, "rotary: head size must be <= ", kMaxHeadDim);
  TORCH_CHECK(x.stride(2) == 1 && (heads <= 1 || x.stride(1) == d),
              "rotary: each row's heads must be contiguous");
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(1) > 0 &&
                  cos.size(1) % 2 == 0 && cos.size(1) <= d &&
                  cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                  cos.is_contiguous() && sin.is_contiguous(),
              "rotary: cos and sin must be contiguous float32 [P, R], R even and <= ", d);
  const int64_t r = cos.size(1);
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == tokens &&
                  positions.scalar_type() == at::kLong && positions.is_contiguous(),
              "rotary: positions must be contiguous int64 [", tokens, "]");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "rotary: position ", pos[t],
                " is outside the table's ", cos.size(0));
  auto out = torch::empty({tokens, heads, d}, x.options());
  with_dtype(x.scalar_type(), "rotary", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x.data_ptr<T>();
    T* op = out.data_ptr<T>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    at::parallel_for(0, tokens, grain_rows(heads * d), [&](int64_t begin, int64_t end) {
      float c[kMaxHeadDim], s[kMaxHeadDim];  // the token's tables, rounded as torch's .to(dtype)
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t i = 0; i < r; ++i) {
          c[i] = round_to<T>(cp[pos[t] * r + i]);
          s[i] = round_to<T>(sp[pos[t] * r + i]);
        }
        rotary_token(xp + t * x.stride(0), heads, d, r, c, s, op + t * heads * d);
      }
    });
  });
  return out;
}
