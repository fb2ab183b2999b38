// The entry point of dwconv_cuda.cu for the host-compiled binding (dwconv_cuda_bind.cpp), without CUDA's headers:
// cudaStream_t is CUstream_st *, declared here as cuda_runtime.h declares it.
#pragma once

struct CUstream_st;

// dims: N, C, K, H, W, P, Q, R, S, stride h/w, padding h/w, dilation h/w. Queues the forward on ``stream`` of the
// current device; throws std::runtime_error when the launch fails.
void launch_depthwise_forward(const void *x, const void *w, const void *b, void *y, const int *dims,
                              bool double_precision, CUstream_st *stream);
