// The CUDA kernel of the example extension: the depthwise forward of dwconv.cpp on a GPU (float32 and float64), for
// tensors torch has on the device. dwconv_cuda_bind.cpp exposes launch_depthwise_forward to Python (pybind11);
// setup.py builds this file with nvcc when DWCONV_CUDA=1. Arguments as custom_forward passes them and example.py's
// supports() admits: contiguous NCHW input (N, C, H, W), weight (C * m, 1, R, S), output (N, C * m, P, Q), bias (C * m)
// or null; any stride, padding and dilation.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "dwconv_cuda.h"

namespace {

constexpr int kThreads = 256;
constexpr long long kGridY = 65535;  // the largest grid y extent: more planes loop inside the kernel

// One thread an element of an output plane (blockIdx.x), blockIdx.y an output plane n * K + k (stepping by gridDim.y);
// the sum runs in the element type in (r, s) order, as dwconv.cpp's does. In-plane offsets fit 32 bits (P * Q and
// H * W under 2^31: supports() checks it), plane offsets are 64-bit.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    depthwise_forward(const T *__restrict__ x, const T *__restrict__ w, const T *__restrict__ b, T *__restrict__ y,
                      long long planes, int C, int m, int H, int W, int P, int Q, int R, int S, int sh, int sw, int ph,
                      int pw, int dh, int dw) {
    const int o = blockIdx.x * kThreads + threadIdx.x;
    if (o >= P * Q) return;
    const int p = o / Q, q = o % Q;
    const int K = C * m;
    for (long long plane = blockIdx.y; plane < planes; plane += gridDim.y) {
        const int k = static_cast<int>(plane % K);
        const T *xc = x + (plane / K * C + k / m) * static_cast<long long>(H) * W;
        const T *wk = w + static_cast<long long>(k) * R * S;
        T acc = b ? b[k] : T(0);
        for (int r = 0; r < R; ++r) {
            const int h = p * sh - ph + r * dh;
            if (h < 0 || h >= H) continue;
            for (int s = 0; s < S; ++s) {
                const int v = q * sw - pw + s * dw;
                if (v >= 0 && v < W) acc += xc[h * W + v] * wk[r * S + s];
            }
        }
        y[plane * P * Q + o] = acc;
    }
}

template <typename T>
void launch(const void *x, const void *w, const void *b, void *y, const int *dims, cudaStream_t stream) {
    const int N = dims[0], C = dims[1], K = dims[2], H = dims[3], W = dims[4], P = dims[5], Q = dims[6];
    const long long planes = static_cast<long long>(N) * K;
    const dim3 grid((P * Q + kThreads - 1) / kThreads, static_cast<unsigned>(planes < kGridY ? planes : kGridY));
    depthwise_forward<T><<<grid, kThreads, 0, stream>>>(
        static_cast<const T *>(x), static_cast<const T *>(w), static_cast<const T *>(b), static_cast<T *>(y), planes,
        C, K / C, H, W, P, Q, dims[7], dims[8], dims[9], dims[10], dims[11], dims[12], dims[13], dims[14]);
}

}  // namespace

// double_precision picks float64; an empty output launches nothing (dwconv_cuda.h).
void launch_depthwise_forward(const void *x, const void *w, const void *b, void *y, const int *dims,
                              bool double_precision, CUstream_st *stream) {
    if (static_cast<long long>(dims[0]) * dims[2] * dims[5] * dims[6] == 0) return;
    if (double_precision)
        launch<double>(x, w, b, y, dims, stream);
    else
        launch<float>(x, w, b, y, dims, stream);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        throw std::runtime_error(std::string("depthwise_forward launch failed: ") + cudaGetErrorString(err));
}
