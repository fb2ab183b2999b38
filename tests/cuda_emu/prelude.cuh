/* A CPU prelude for tests: the CUDA kernel bodies compiled as host C++ and run on host fibers, one per GPU thread.
 *
 * It defines the names cuda/prelude.cuh defines, with host meanings: __shared__ becomes a function-local static
 * (blocks run one after another, so a static is exactly one block's shared memory), threads are fibers that
 * meet at barriers, warp shuffles go through a buffer synchronised per warp, and the
 * 16-bit conversions use the compiler's _Float16 (round to nearest even, as the GPU's). This is how
 * tests/test_cuda_compile.py checks the bodies' arithmetic and indexing on a machine without a GPU.
 */
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ucontext.h>
#include <vector>

struct pc_dim3 {
    unsigned x, y, z;
};
static pc_dim3 threadIdx, blockIdx, blockDim, gridDim;

/* GPU threads are fibers (ucontext) run one at a time: a barrier parks the running fiber until every fiber
 * of its group (the block, or one warp for shuffles) has reached it. */
struct pc_emu_fiber {
    ucontext_t ctx;
    int wait; /* 0 runnable, 1 at the block barrier, 2 + w at warp w's barrier */
    bool done;
};
static std::vector<pc_emu_fiber> pc_emu_fibers;
static ucontext_t pc_emu_sched;

inline void pc_emu_wait(int kind) {
    pc_emu_fiber &f = pc_emu_fibers[threadIdx.x];
    f.wait = kind;
    swapcontext(&f.ctx, &pc_emu_sched);
}

#define PC_VENDOR_EMU 1
#define PC_KERNEL extern "C"
#define PC_LAUNCH_BOUNDS(threads)
#define PC_LAUNCH_BOUNDS_MIN(threads, blocks)
#define PC_DEVICE inline
#define PC_SHARED static
#define PC_RESTRICT __restrict__
#define PC_BARRIER() pc_emu_wait(1)
#ifndef PC_WARP_SIZE
#define PC_WARP_SIZE 32
#endif
#define PC_TENSOR_CORES 0

typedef unsigned long long pc_lanemask_t;
#define PC_FULL_MASK (~0ull)

template <typename T>
inline T pc_shfl_down(T v, int delta) {
    static T buf[1024];
    const unsigned w = threadIdx.x / PC_WARP_SIZE, lane = threadIdx.x % PC_WARP_SIZE;
    buf[threadIdx.x] = v;
    pc_emu_wait(2 + (int)w);
    const T r = lane + delta < PC_WARP_SIZE ? buf[threadIdx.x + delta] : v;
    pc_emu_wait(2 + (int)w);
    return r;
}

template <typename T>
inline T pc_shfl_xor(T v, int mask) {
    static T buf[1024];
    const unsigned w = threadIdx.x / PC_WARP_SIZE;
    buf[threadIdx.x] = v;
    pc_emu_wait(2 + (int)w);
    const T r = buf[w * PC_WARP_SIZE + ((threadIdx.x % PC_WARP_SIZE) ^ (unsigned)mask)];
    pc_emu_wait(2 + (int)w);
    return r;
}

inline float pc_atomic_add(float *p, float v) {
    const float old = *p; /* fibers never run concurrently */
    *p = old + v;
    return old;
}
inline double pc_atomic_add(double *p, double v) {
    const double old = *p;
    *p = old + v;
    return old;
}

inline float pc_f16_bits_to_float(unsigned short h) {
    _Float16 f;
    std::memcpy(&f, &h, 2);
    return (float)f;
}
inline unsigned short pc_float_to_f16_bits(float f) {
    const _Float16 h = (_Float16)f;
    unsigned short b;
    std::memcpy(&b, &h, 2);
    return b;
}
inline float pc_bf16_bits_to_float(unsigned short b) {
    const unsigned u = ((unsigned)b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned short pc_float_to_bf16_bits(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)(((u >> 16) & 0x8000u) | 0x7fc0u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

/* Note [vector access] of cuda/prelude.cuh: plain copies on the host. */
template <typename V>
inline V pc_ld_vec(const V *p) {
    return *p;
}
template <typename V>
inline void pc_st_vec(V *p, const V &v) {
    *p = v;
}

/* Note [async copies] of cuda/prelude.cuh: synchronous copies here (no cp.async). */
#define PC_ASYNC_COPY 0
template <int BYTES>
struct pc_cp_block {
    alignas(BYTES) unsigned char b[BYTES];
};
template <int BYTES>
inline void pc_cp_async(void *dst, const void *src, bool ok) {
    *(pc_cp_block<BYTES> *)dst = ok ? *(const pc_cp_block<BYTES> *)src : pc_cp_block<BYTES>{};
}
inline void pc_cp_async_commit() {}
template <int N>
inline void pc_cp_async_wait() {}

/* Note [dependent launch] of cuda/prelude.cuh: launches here are always ordered. */
inline void pc_grid_dependency_wait() {}
