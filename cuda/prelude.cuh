/* portconv CUDA prelude: every vendor idiom the kernel bodies use, and nothing else.
 *
 * Note [preludes]: the bodies (conv_*.cuh, reduce.cuh, types.cuh, common.cuh) name only what is defined
 * here: qualifiers, the barrier, the warp size and lane-mask type, warp shuffles, atomics and the 16-bit
 * float conversions. A HIP prelude that defines the same names compiles the same bodies for AMD GPUs (wave64
 * or wave32) and for HIP-on-NVIDIA. The bodies use threadIdx/blockIdx/blockDim/gridDim directly: CUDA and HIP
 * spell them alike. No system header is included, so NVRTC needs no include path (the kernels run from a
 * CuPy wheel with no CUDA toolkit installed).
 */
#pragma once

#define PC_VENDOR_CUDA 1
/* Every PC_KERNEL definition sits in #if !defined(PC_ONLY) || defined(PC_ONLY_<its name>) ... #endif: a module
   built with PC_ONLY holds the one kernel it names (Note [one kernel a module], portconv/backends/program.py;
   tests/test_cuda_compile.py checks every guard). */
#define PC_KERNEL extern "C" __global__
#define PC_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
/* ... and at least `blocks` resident blocks per SM: ptxas keeps the registers to 65536 / (threads x blocks) */
#define PC_LAUNCH_BOUNDS_MIN(threads, blocks) __launch_bounds__(threads, blocks)
#define PC_DEVICE __device__ __forceinline__
#define PC_SHARED __shared__
#define PC_RESTRICT __restrict__
#define PC_BARRIER() __syncthreads()

/* Warp size: 32 on every NVIDIA GPU. Bodies size their reductions from PC_WARP_SIZE and never assume 32. */
#ifndef PC_WARP_SIZE
#define PC_WARP_SIZE 32
#endif

/* Lane masks are 64-bit in the bodies (HIP on wave64 needs all 64 bits); CUDA's shuffles take the low 32. */
typedef unsigned long long pc_lanemask_t;
#define PC_FULL_MASK (~0ull)

template <typename T>
PC_DEVICE T pc_shfl_down(T v, int delta) {
    return __shfl_down_sync((unsigned)(PC_FULL_MASK & 0xffffffffull), v, delta, PC_WARP_SIZE);
}

template <typename T>
PC_DEVICE T pc_shfl_xor(T v, int mask) {
    return __shfl_xor_sync((unsigned)(PC_FULL_MASK & 0xffffffffull), v, mask, PC_WARP_SIZE);
}

PC_DEVICE float pc_atomic_add(float *p, float v) { return atomicAdd(p, v); }
PC_DEVICE double pc_atomic_add(double *p, double v) { return atomicAdd(p, v); } /* sm_60 and newer */

/* 16-bit floats are stored as raw bits; these four are the only conversions the bodies use. */
PC_DEVICE float pc_f16_bits_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

PC_DEVICE unsigned short pc_float_to_f16_bits(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

PC_DEVICE float pc_bf16_bits_to_float(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }

/* Round to nearest even; NaN stays a (quiet) NaN. sm_80+: one cvt.rn.bf16.f32 (what PyTorch's __float2bfloat16 runs;
 * NaN becomes the canonical 0x7fff), else six integer instructions (NaN keeps its sign: 0x7fc0 | sign). */
PC_DEVICE unsigned short pc_float_to_bf16_bits(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#endif
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)(((u >> 16) & 0x8000u) | 0x7fc0u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

/* Note [vector access]: one aligned access of a small aggregate (pc_vec of cuda/conv_depthwise_tile.cuh, e.g.
 * two bfloat16 in 32 bits); the caller guarantees that p is aligned to sizeof(V). */
template <typename V>
PC_DEVICE V pc_ld_vec(const V *p) {
    return *p;
}
template <typename V>
PC_DEVICE void pc_st_vec(V *p, const V &v) {
    *p = v;
}

/* Note [async copies]: global -> shared copies that bypass the registers (cp.async, sm_80 and newer). A thread
 * issues copies of BYTES (4, 8 or 16, both addresses aligned to it; ok false writes zeros: src-size 0, src must still
 * be a valid address), closes them as a group with pc_cp_async_commit, and pc_cp_async_wait<N> returns once at most
 * N of its groups are in flight (a compiler memory barrier too: shared reads of the copied data stay after it).
 * Other threads see the data only after a barrier. PC_ASYNC_COPY says whether the copies are asynchronous; on older
 * GPUs, and in the HIP and CPU preludes, the same calls copy synchronously and the wait does nothing. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PC_ASYNC_COPY 1
template <int BYTES>
PC_DEVICE void pc_cp_async(void *dst, const void *src, bool ok) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(d), "l"(src), "n"(BYTES), "r"(ok ? BYTES : 0));
}
PC_DEVICE void pc_cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
PC_DEVICE void pc_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
#define PC_ASYNC_COPY 0
template <int BYTES>
struct pc_cp_block {
    alignas(BYTES) unsigned char b[BYTES];
};
template <int BYTES>
PC_DEVICE void pc_cp_async(void *dst, const void *src, bool ok) {
    *(pc_cp_block<BYTES> *)dst = ok ? *(const pc_cp_block<BYTES> *)src : pc_cp_block<BYTES>{};
}
PC_DEVICE void pc_cp_async_commit() {}
template <int N>
PC_DEVICE void pc_cp_async_wait() {}
#endif

/* Note [dependent launch]: a kernel launched with programmatic stream serialization (the finalize of split
 * sums, portconv/backends/simt/runtime.py) may start while the kernel before it in the stream still runs; it calls
 * pc_grid_dependency_wait() before it touches memory, which returns once that kernel has completed and its writes
 * are visible (griddepcontrol.wait, sm_90 and newer; a no-op for a kernel launched the ordinary way). No producer
 * calls griddepcontrol.launch_dependents: its blocks trigger the dependent launch as they exit. (Calling it first
 * thing in the depthwise weight-gradient kernels was measured: no gain, docs/kernels/depthwise.md.)
 * Older GPUs, HIP and the CPU emulator: it does nothing (their launches are always ordered). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
PC_DEVICE void pc_grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
#else
PC_DEVICE void pc_grid_dependency_wait() {}
#endif

/* Note [tensor cores]: matrix-unit (mma/wmma) paths of the implicit GEMM are CUDA-only. They are compiled
 * only where PC_TENSOR_CORES is 1; the HIP prelude leaves it 0 and the bodies fall back to the shared-memory
 * FMA tile, which is correct everywhere. */
#ifndef PC_TENSOR_CORES
#define PC_TENSOR_CORES 0
#endif
