// The CUDA forwards of memfit's fused kernels (src/model/kernels/) and the in-place optimizer
// step (src/optim/inplace.rs). Compiled to PTX by build.rs (nvcc --ptx) when the `cuda` feature
// is on; loaded once per device by src/model/kernels/cuda.rs.
//
// Every kernel reads its inputs in their type (f32, f16, bf16), computes in f32 and writes its
// output in the input's type, as the CPU kernels (cpu.rs) do. Row kernels run one block of
// ROW_THREADS threads per row; element kernels one thread per element. Nothing here allocates:
// the Rust side allocates each output, and the attention softmax, the bias add and the optimizer
// updates rewrite their buffer in place.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#define ROW_THREADS 256

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T of_f(float v);
template <> __device__ __forceinline__ float of_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half of_f<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 of_f<__nv_bfloat16>(float v) {
    return __float2bfloat16(v);
}

// The sum (max_op = false) or maximum of `v` over the block; every thread gets the result.
// `sh` holds one float per warp.
__device__ float block_reduce(float v, bool max_op) {
    __shared__ float sh[ROW_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffff, v, o);
        v = max_op ? fmaxf(v, w) : v + w;
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();  // sh may still be read by a previous reduction
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float r = max_op ? -INFINITY : 0.0f;
    for (int i = 0; i < ROW_THREADS / 32; i++) r = max_op ? fmaxf(r, sh[i]) : r + sh[i];
    return r;
}

// LayerNorm (centre = 1, b given) or RMSNorm (centre = 0, b null) of rows of n.
// A row's mean (0 without `centre`) and 1/√(var + eps), reduced over the block.
template <typename T>
__device__ void row_stats(const T *row, int n, float eps, int centre, float *mean, float *rstd) {
    float m = 0.0f;
    if (centre) {
        float s = 0.0f;
        for (int i = threadIdx.x; i < n; i += ROW_THREADS) s += to_f(row[i]);
        m = block_reduce(s, false) / n;
    }
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) {
        float d = to_f(row[i]) - m;
        s += d * d;
    }
    *mean = m;
    *rstd = rsqrtf(block_reduce(s, false) / n + eps);
}

template <typename T>
__device__ void norm(const T *x, const T *w, const T *b, T *out, int n, float eps, int centre) {
    const T *row = x + (size_t)blockIdx.x * n;
    T *o = out + (size_t)blockIdx.x * n;
    float mean, rstd;
    row_stats<T>(row, n, eps, centre, &mean, &rstd);
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) {
        float y = (to_f(row[i]) - mean) * rstd * to_f(w[i]);
        o[i] = of_f<T>(b ? y + to_f(b[i]) : y);
    }
}

// Scale, causal mask and softmax of rows of sk scores, in place. Row r is query r % sq of its
// head; with `causal` it sees keys lo ..= r % sq + sk − sq, lo = 0 or, with a sliding
// `window` > 0, the last `window` of them; the rest become 0.
template <typename T>
__device__ void attn_softmax(T *p, int sq, int sk, float scale, int causal, int window) {
    T *row = p + (size_t)blockIdx.x * sk;
    int hi = causal ? (int)(blockIdx.x % sq) + 1 + (sk - sq) : sk;
    int lo = (causal && window > 0 && hi > window) ? hi - window : 0;
    float m = -INFINITY;
    for (int i = lo + threadIdx.x; i < hi; i += ROW_THREADS) m = fmaxf(m, to_f(row[i]) * scale);
    m = block_reduce(m, true);
    float s = 0.0f;
    for (int i = lo + threadIdx.x; i < hi; i += ROW_THREADS) s += __expf(to_f(row[i]) * scale - m);
    float inv = 1.0f / block_reduce(s, false);
    for (int i = threadIdx.x; i < sk; i += ROW_THREADS)
        row[i] = of_f<T>(i >= lo && i < hi ? __expf(to_f(row[i]) * scale - m) * inv : 0.0f);
}

// Cross-entropy of each row of v logits against its target: m + log Σ exp(x − m) − x[t], into
// an f32 row buffer (NaN for a target not below v).
template <typename T> __device__ void ce_rows(const T *x, const uint32_t *t, float *loss, int v) {
    const T *row = x + (size_t)blockIdx.x * v;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < v; i += ROW_THREADS) m = fmaxf(m, to_f(row[i]));
    m = block_reduce(m, true);
    float s = 0.0f;
    for (int i = threadIdx.x; i < v; i += ROW_THREADS) s += __expf(to_f(row[i]) - m);
    s = block_reduce(s, false);
    if (threadIdx.x == 0) {
        uint32_t target = t[blockIdx.x];
        loss[blockIdx.x] = target < (uint32_t)v ? m + logf(s) - to_f(row[target]) : NAN;
    }
}

// The mean of n row losses into out[0]; one block.
template <typename T> __device__ void ce_mean(const float *loss, T *out, int n) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) s += loss[i];
    s = block_reduce(s, false);
    if (threadIdx.x == 0) out[0] = of_f<T>(s / n);
}

// y[i] += b[i % out] over `total` elements, in place.
template <typename T> __device__ void add_bias(T *y, const T *b, size_t total, int out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] = of_f<T>(to_f(y[i]) + to_f(b[i % out]));
}

// SwiGLU: out[i] = silu(g[i])·u[i], one pass.
template <typename T> __device__ void silu_mul(const T *g, const T *u, T *out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = to_f(g[i]);
    out[i] = of_f<T>(a / (1.0f + __expf(-a)) * to_f(u[i]));
}

// SwiGLU's backward in one pass: out[i] = d/d gate, out[n + i] = d/d up, computed in f32.
template <typename T> __device__ void silu_mul_grad(const T *g, const T *u, const T *dy, T *out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = to_f(g[i]), b = to_f(u[i]), d = to_f(dy[i]);
    float s = 1.0f / (1.0f + __expf(-a));
    out[i] = of_f<T>(d * b * s * (1.0f + a * (1.0f - s)));
    out[n + i] = of_f<T>(d * a * s);
}

// gpt-oss's clamped SwiGLU: g' = min(g, 7), u' = clamp(u, -7, 7), out = (u' + 1)·g'·σ(1.702 g').
template <typename T> __device__ void oss_glu(const T *g, const T *u, T *out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = fminf(to_f(g[i]), 7.0f), b = fminf(fmaxf(to_f(u[i]), -7.0f), 7.0f);
    out[i] = of_f<T>((b + 1.0f) * a / (1.0f + __expf(-1.702f * a)));
}

// Its backward in one pass: out[i] = d/d gate, out[n + i] = d/d up, in f32; no gradient past
// a clamp (torch's: bounds included).
template <typename T> __device__ void oss_glu_grad(const T *g, const T *u, const T *dy, T *out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g0 = to_f(g[i]), u0 = to_f(u[i]), d = to_f(dy[i]);
    float a = fminf(g0, 7.0f), b = fminf(fmaxf(u0, -7.0f), 7.0f);
    float s = 1.0f / (1.0f + __expf(-1.702f * a));
    out[i] = of_f<T>(g0 <= 7.0f ? d * (b + 1.0f) * s * (1.0f + 1.702f * a * (1.0f - s)) : 0.0f);
    out[n + i] = of_f<T>(u0 >= -7.0f && u0 <= 7.0f ? d * a * s : 0.0f);
}

// GELU's (tanh approximation) backward in one pass: out[i] = dy[i]·gelu'(x[i]), in f32
// (gelu' = ½(1 + tanh u) + ½·x·(1 − tanh² u)·c(1 + 3a x²), u = c(x + a x³)).
template <typename T> __device__ void gelu_grad(const T *x, const T *dy, T *out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float c = 0.7978845608028654f, a = 0.044715f;
    float v = to_f(x[i]);
    float t = tanhf(c * (v + a * v * v * v));
    float du = c * (1.0f + 3.0f * a * v * v);
    out[i] = of_f<T>(to_f(dy[i]) * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du));
}

// A norm's input gradient, one block per row of n: dx = rstd·(dy [− mean(dy)] − x̂·mean(dy·x̂))
// with dy = g·w, x̂ = (x − mean)·rstd (mean 0 without `centre`: RMSNorm); the row's mean and
// rstd into stats[2r], stats[2r + 1] for the weight's gradient.
template <typename T>
__device__ void norm_grad_x(const T *x, const T *w, const T *g, T *out, float *stats, int n,
                            float eps, int centre) {
    const T *xr = x + (size_t)blockIdx.x * n;
    const T *gr = g + (size_t)blockIdx.x * n;
    T *o = out + (size_t)blockIdx.x * n;
    float mean, rstd;
    row_stats<T>(xr, n, eps, centre, &mean, &rstd);
    float s1 = 0.0f, s2 = 0.0f;
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) {
        float dy = to_f(gr[i]) * to_f(w[i]);
        s1 += dy;
        s2 += dy * (to_f(xr[i]) - mean) * rstd;
    }
    float m1 = centre ? block_reduce(s1, false) / n : 0.0f;
    float m2 = block_reduce(s2, false) / n;
    for (int i = threadIdx.x; i < n; i += ROW_THREADS) {
        float dy = to_f(gr[i]) * to_f(w[i]);
        o[i] = of_f<T>(rstd * (dy - m1 - (to_f(xr[i]) - mean) * rstd * m2));
    }
    if (threadIdx.x == 0) {
        stats[2 * (size_t)blockIdx.x] = mean;
        stats[2 * (size_t)blockIdx.x + 1] = rstd;
    }
}

// A norm's weight (and, with `centre`, bias) gradient, one thread per column j over every row:
// dw[j] = Σ g·x̂, db[j] = Σ g, from the rows' stats.
template <typename T>
__device__ void norm_grad_w(const T *x, const T *g, const float *stats, T *dw, T *db, int n,
                            size_t rows, int centre) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= (size_t)n) return;
    float a = 0.0f, b = 0.0f;
    for (size_t r = 0; r < rows; r++) {
        float gv = to_f(g[r * n + j]);
        a += gv * (to_f(x[r * n + j]) - stats[2 * r]) * stats[2 * r + 1];
        b += gv;
    }
    dw[j] = of_f<T>(a);
    if (centre) db[j] = of_f<T>(b);
}

// y[i] *= s[(i / out) * stride] over `total` elements, in place: each row of `out` scaled by
// its own factor (a column of a strided matrix).
template <typename T> __device__ void scale_rows(T *y, const T *s, size_t total, int out, size_t stride) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] = of_f<T>(to_f(y[i]) * to_f(s[(i / out) * stride]));
}

// "Rotate half" of rows of d = 2h at position r % s: pairs (j, j + h), `pairs` of them in all.
template <typename T>
__device__ void rotary(const T *x, const T *cos, const T *sin, T *out, int n, int s, int h,
                       size_t pairs, size_t s0, size_t s1, size_t s2) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pairs) return;
    size_t r = i / h;
    int j = i % h;
    size_t pos = r % s;
    size_t p = pos * h + j;
    // x may be strided (batch, head, position strides s0, s1, s2; the last dimension dense).
    const T *xr = x + (r / ((size_t)s * n)) * s0 + (r / s % n) * s1 + pos * s2;
    T *o = out + r * 2 * h;
    float x1 = to_f(xr[j]), x2 = to_f(xr[j + h]), c = to_f(cos[p]), sn = to_f(sin[p]);
    o[j] = of_f<T>(x1 * c - x2 * sn);
    o[j + h] = of_f<T>(x2 * c + x1 * sn);
}

// d ← a·d + b·x (b·x² with `square`), in place.
template <typename T> __device__ void axpby(T *d, const T *x, size_t n, float a, float b, int square) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float xv = to_f(x[i]);
    d[i] = of_f<T>(a * to_f(d[i]) + b * (square ? xv * xv : xv));
}

// AdamW's weight update from the updated moments, in place.
template <typename T>
__device__ void adam_update(T *d, const T *m, const T *v, size_t n, float lr, float decay,
                            float sm, float sv, float eps) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    d[i] = of_f<T>(to_f(d[i]) * decay - lr * (to_f(m[i]) * sm) / (sqrtf(to_f(v[i]) * sv) + eps));
}

// FP8 e4m3 (the `e4m3fn` of DeepSeek's checkpoints: no infinities, S.1111.111 is NaN) to float.
__device__ __forceinline__ float e4m3_to_f(uint8_t b) {
    int e = (b >> 3) & 0xF, m = b & 7;
    float v;
    if (e == 0) v = ldexpf((float)m, -9);                      // m/8 · 2^-6
    else if (e == 15 && m == 7) v = __int_as_float(0x7fc00000); // NaN
    else v = ldexpf((float)(8 + m), e - 10);                     // (1 + m/8) · 2^(e-7)
    return (b & 0x80) ? -v : v;
}

// Block-scaled FP8 weights into T: out[r, c] = e4m3(w[r, c]) · scale[r / 128, c / 128].
template <typename T>
__device__ void fp8_dequant(const uint8_t *w, const float *scale, T *out, size_t rows, size_t cols,
                            size_t scale_cols) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    size_t r = i / cols, c = i % cols;
    out[i] = of_f<T>(e4m3_to_f(w[i]) * scale[(r / 128) * scale_cols + c / 128]);
}

// MXFP4 weights into T: out[r, c] = e2m1(nibble c of row r) · 2^(scale[r, c / 32] − 127), the
// low nibble of a byte the even element, bit 3 of a nibble its sign.
template <typename T>
__device__ void mxfp4_dequant(const uint8_t *blocks, const uint8_t *scales, T *out, size_t rows,
                              size_t cols) {
    const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    uint8_t byte = blocks[i / 2];
    uint8_t nib = (i % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
    float v = e2m1[nib & 7];
    if (nib & 8) v = -v;
    out[i] = of_f<T>(ldexpf(v, (int)scales[i / 32] - 127));
}

#define KERNELS(T, SFX)                                                                          \
    extern "C" __global__ void memfit_norm_##SFX(const T *x, const T *w, const T *b, T *out,    \
                                                 int n, float eps, int centre) {                 \
        norm<T>(x, w, centre ? b : nullptr, out, n, eps, centre);                                \
    }                                                                                            \
    extern "C" __global__ void memfit_attn_softmax_##SFX(T *p, int sq, int sk, float scale,     \
                                                         int causal, int window) {               \
        attn_softmax<T>(p, sq, sk, scale, causal, window);                                       \
    }                                                                                            \
    extern "C" __global__ void memfit_ce_rows_##SFX(const T *x, const uint32_t *t, float *loss, \
                                                    int v) {                                     \
        ce_rows<T>(x, t, loss, v);                                                               \
    }                                                                                            \
    extern "C" __global__ void memfit_ce_mean_##SFX(const float *loss, T *out, int n) {         \
        ce_mean<T>(loss, out, n);                                                                \
    }                                                                                            \
    extern "C" __global__ void memfit_silu_mul_##SFX(const T *g, const T *u, T *out, size_t n) { \
        silu_mul<T>(g, u, out, n);                                                               \
    }                                                                                            \
    extern "C" __global__ void memfit_silu_mul_grad_##SFX(const T *g, const T *u, const T *dy,  \
                                                          T *out, size_t n) {                    \
        silu_mul_grad<T>(g, u, dy, out, n);                                                      \
    }                                                                                            \
    extern "C" __global__ void memfit_oss_glu_##SFX(const T *g, const T *u, T *out, size_t n) {  \
        oss_glu<T>(g, u, out, n);                                                                \
    }                                                                                            \
    extern "C" __global__ void memfit_oss_glu_grad_##SFX(const T *g, const T *u, const T *dy,   \
                                                         T *out, size_t n) {                     \
        oss_glu_grad<T>(g, u, dy, out, n);                                                       \
    }                                                                                            \
    extern "C" __global__ void memfit_gelu_grad_##SFX(const T *x, const T *dy, T *out,          \
                                                      size_t n) {                                \
        gelu_grad<T>(x, dy, out, n);                                                             \
    }                                                                                            \
    extern "C" __global__ void memfit_norm_grad_x_##SFX(const T *x, const T *w, const T *g,      \
                                                        T *out, float *stats, int n, float eps,  \
                                                        int centre) {                            \
        norm_grad_x<T>(x, w, g, out, stats, n, eps, centre);                                     \
    }                                                                                            \
    extern "C" __global__ void memfit_norm_grad_w_##SFX(const T *x, const T *g,                  \
                                                        const float *stats, T *dw, T *db, int n, \
                                                        size_t rows, int centre) {               \
        norm_grad_w<T>(x, g, stats, dw, db, n, rows, centre);                                    \
    }                                                                                            \
    extern "C" __global__ void memfit_scale_rows_##SFX(T *y, const T *s, size_t total, int out,  \
                                                       size_t stride) {                          \
        scale_rows<T>(y, s, total, out, stride);                                                 \
    }                                                                                            \
    extern "C" __global__ void memfit_fp8_dequant_##SFX(const uint8_t *w, const float *scale,   \
                                                        T *out, size_t rows, size_t cols,        \
                                                        size_t scale_cols) {                     \
        fp8_dequant<T>(w, scale, out, rows, cols, scale_cols);                                   \
    }                                                                                            \
    extern "C" __global__ void memfit_mxfp4_dequant_##SFX(const uint8_t *blocks,                \
                                                          const uint8_t *scales, T *out,         \
                                                          size_t rows, size_t cols) {            \
        mxfp4_dequant<T>(blocks, scales, out, rows, cols);                                       \
    }                                                                                            \
    extern "C" __global__ void memfit_add_bias_##SFX(T *y, const T *b, size_t total, int out) { \
        add_bias<T>(y, b, total, out);                                                           \
    }                                                                                            \
    extern "C" __global__ void memfit_rotary_##SFX(const T *x, const T *cos, const T *sin,      \
                                                   T *out, int n, int s, int h, size_t pairs,    \
                                                   size_t s0, size_t s1, size_t s2) {            \
        rotary<T>(x, cos, sin, out, n, s, h, pairs, s0, s1, s2);                                 \
    }                                                                                            \
    extern "C" __global__ void memfit_axpby_##SFX(T *d, const T *x, size_t n, float a, float b, \
                                                  int square) {                                  \
        axpby<T>(d, x, n, a, b, square);                                                         \
    }                                                                                            \
    extern "C" __global__ void memfit_adam_update_##SFX(T *d, const T *m, const T *v, size_t n, \
                                                        float lr, float decay, float sm,         \
                                                        float sv, float eps) {                   \
        adam_update<T>(d, m, v, n, lr, decay, sm, sv, eps);                                      \
    }

KERNELS(float, f32)
KERNELS(__half, f16)
KERNELS(__nv_bfloat16, bf16)
