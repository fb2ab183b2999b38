/* The seed user's depthwise conv2d forward: ONE source for CUDA and HIP (README.md beside this file).
 *
 * Note [one source for CUDA and HIP]: CuPy compiles this text unchanged with NVRTC on NVIDIA GPUs and with hiprtc on
 * AMD GPUs (cupy-rocm); CI builds it with hipcc for gfx90a / gfx1030 and with NVRTC for sm_90, and the GPU tests run
 * it again behind portconv's HIP->CUDA prelude (HIP-on-NVIDIA). So it uses only what both device languages give a
 * kernel without a header: __global__, __device__, __forceinline__, __launch_bounds__, __restrict__,
 * blockIdx/blockDim/threadIdx/gridDim, __float_as_uint/__uint_as_float. No #include (hiprtc pre-includes
 * hip_runtime.h, NVRTC declares these itself), no warp-level code (a wave is 32 lanes or 64), no inline PTX, no
 * cuda_fp16.h / hip_bf16.h: bfloat16 moves as its 16 bits.
 *
 * What it computes (dwconv_cupy.supports admits nothing else): x (N, C, H, W) and w (C*M, 1, R, S) contiguous, b (C*M)
 * or none, y (N, C*M, P, Q) contiguous:
 *     y[n, k, p, q] = b[k] + sum_{r < R, s < S} w[k, 0, r, s] * x[n, k / M, p*SH - PH + r, q*SW - PW + s]
 * with x zero outside its plane: any kernel size, stride and padding; dilation 1. The sum runs in Acc (float for
 * float32 and bfloat16, double for float64) in the order r, s, and is rounded to the element type once.
 * Launch: one thread an element of an output plane (blockIdx.x * 256 + threadIdx.x < P*Q), blockIdx.y the plane
 * n * K + k, looping by gridDim.y over more planes than a grid's y extent (65535) holds. Offsets inside a plane are
 * 32-bit (P*Q and H*W under 2^31: supports() checks it), plane offsets 64-bit.
 */

#define DW_THREADS 256

__device__ __forceinline__ float dw_load(const float *p, long long i) { return p[i]; }
__device__ __forceinline__ double dw_load(const double *p, long long i) { return p[i]; }
__device__ __forceinline__ float dw_load(const unsigned short *p, long long i) {
    return __uint_as_float((unsigned)p[i] << 16); /* bfloat16: the upper half of a float32 */
}

__device__ __forceinline__ void dw_store(float *p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void dw_store(double *p, long long i, double v) { p[i] = v; }
/* float32 -> bfloat16 rounded to nearest even, as PyTorch rounds; a NaN stays a (quiet) NaN */
__device__ __forceinline__ void dw_store(unsigned short *p, long long i, float v) {
    const unsigned u = __float_as_uint(v);
    p[i] = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)
                                            : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <typename T, typename Acc>
__device__ __forceinline__ void dw_forward(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ b,
                                           T *__restrict__ y, long long planes, int C, int M, int H, int W, int P,
                                           int Q, int R, int S, int SH, int SW, int PH, int PW) {
    const int o = (int)(blockIdx.x * blockDim.x + threadIdx.x); /* element of the output plane */
    if (o >= P * Q) return;
    const int p = o / Q, q = o - p * Q;
    const int h0 = p * SH - PH, v0 = q * SW - PW;
    const int K = C * M;
    for (long long plane = blockIdx.y; plane < planes; plane += gridDim.y) {
        const int k = (int)(plane % K);
        const T *xc = x + (plane / K * C + k / M) * (long long)H * W;
        const T *wk = w + (long long)k * R * S;
        Acc acc = b ? (Acc)dw_load(b, k) : (Acc)0;
        for (int r = 0; r < R; ++r) {
            const int h = h0 + r;
            if (h < 0 || h >= H) continue;
            for (int s = 0; s < S; ++s) {
                const int v = v0 + s;
                if (v >= 0 && v < W) acc += (Acc)dw_load(xc, h * W + v) * (Acc)dw_load(wk, r * S + s);
            }
        }
        dw_store(y, plane * P * Q + o, acc);
    }
}

/* One entry a dtype, unmangled (extern "C") so CuPy finds it by name on both vendors. */
#define DW_ENTRY(NAME, T, ACC)                                                                                 \
    extern "C" __global__ void __launch_bounds__(DW_THREADS)                                                   \
        NAME(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ b, T *__restrict__ y,      \
             long long planes, int C, int M, int H, int W, int P, int Q, int R, int S, int SH, int SW, int PH,   \
             int PW) {                                                                                         \
        dw_forward<T, ACC>(x, w, b, y, planes, C, M, H, W, P, Q, R, S, SH, SW, PH, PW);                       \
    }

DW_ENTRY(dw_forward_f32, float, float)
DW_ENTRY(dw_forward_f64, double, double)
DW_ENTRY(dw_forward_bf16, unsigned short, float)
