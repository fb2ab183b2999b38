/* portconv HIP platform layer for NVIDIA GPUs: HIP's device names mapped onto CUDA ("HIP-on-NVIDIA").
 *
 * This is what HIP's own nvidia platform (hip/nvidia_detail/nvidia_hip_runtime.h) does, cut down to the
 * device-side names portconv's HIP sources use, and written without system headers so NVRTC compiles it
 * with no include path (CuPy wheels ship no CUDA toolkit):
 *   hipThreadIdx_x ... hipGridDim_z, HIP_DYNAMIC_SHARED, hipLaunchKernelGGL (nvcc host code only)
 *   __shfl_down / __shfl_xor (HIP's mask-less forms) and the 64-bit-mask __shfl_*_sync of ROCm 7, both on
 *   CUDA's __shfl_*_sync with 32-bit masks of physical lanes
 *   hip_fp16's __half, __half2float, __float2half_rn, __half_as_ushort, __ushort_as_half on the PTX
 *   conversion instructions (cuda_fp16.h would need the toolkit's include directory)
 *
 * Note [wave size on NVIDIA]: a warp has 32 lanes, so WAVE_SIZE may be 32 (the default) or a narrower
 * logical wave (16, 8): an aligned segment of the warp, shuffled with width WAVE_SIZE and a mask naming that
 * segment's lanes only. That lets a test run the bodies' wave-size-generic reductions with a wave size other
 * than 32 on real hardware.
 * Wave64 cannot execute here; it is compiled for gfx90a/gfx940 by scripts/hip_build.py instead.
 */
#pragma once

#define PC_VENDOR_HIP 1
#define PC_HIP_NVIDIA 1
#ifndef __HIP_PLATFORM_NVIDIA__
#define __HIP_PLATFORM_NVIDIA__ 1
#endif

#ifndef WAVE_SIZE
#define WAVE_SIZE 32
#endif
#if WAVE_SIZE != 32 && WAVE_SIZE != 16 && WAVE_SIZE != 8
#error "portconv HIP-on-NVIDIA: WAVE_SIZE must be 32, 16 or 8 (a warp has 32 lanes; see Note [wave size on NVIDIA])"
#endif

/* --- thread coordinates and launch (HIP spellings) ----------------------------------------------------- */
#define hipThreadIdx_x threadIdx.x
#define hipThreadIdx_y threadIdx.y
#define hipThreadIdx_z threadIdx.z
#define hipBlockIdx_x blockIdx.x
#define hipBlockIdx_y blockIdx.y
#define hipBlockIdx_z blockIdx.z
#define hipBlockDim_x blockDim.x
#define hipBlockDim_y blockDim.y
#define hipBlockDim_z blockDim.z
#define hipGridDim_x gridDim.x
#define hipGridDim_y gridDim.y
#define hipGridDim_z gridDim.z
#define HIP_DYNAMIC_SHARED(type, var) extern __shared__ type var[];
#if !defined(__CUDACC_RTC__)
#define hipLaunchKernelGGL(kernel, blocks, threads, shmem, stream, ...) \
    kernel<<<(blocks), (threads), (shmem), (stream)>>>(__VA_ARGS__)
#endif

/* --- shuffles: HIP's forms on CUDA's _sync forms ---------------------------------------------------------- */
#define PC_HIP_FULL_MASK 0xffffffffffffffffull /* HIP's 64-bit mask of a whole (logical) wave */

/* A HIP lane mask of this thread's logical wave as CUDA's 32-bit mask of physical lanes: a wave of WAVE_SIZE
 * lanes is the aligned WAVE_SIZE-lane segment of the warp holding this thread, so bit i of the HIP mask is
 * physical lane (segment base + i). Code inside `if (wave == 0)` then names only the lanes that run it. */
__device__ __forceinline__ unsigned __hip_nv_lane_mask(unsigned long long mask) {
#if WAVE_SIZE == 32
    return (unsigned)(mask & 0xffffffffull);
#else
    unsigned lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    return (unsigned)(mask & ((1ull << WAVE_SIZE) - 1ull)) << (lane & ~(unsigned)(WAVE_SIZE - 1));
#endif
}

/* HIP's mask-less forms: every active lane takes part, as CUDA's deprecated __shfl_* did. */
template <typename T>
__device__ __forceinline__ T __shfl_down(T v, unsigned int delta, int width = WAVE_SIZE) {
    return __shfl_down_sync(__activemask(), v, delta, width);
}
template <typename T>
__device__ __forceinline__ T __shfl_xor(T v, int lane_mask, int width = WAVE_SIZE) {
    return __shfl_xor_sync(__activemask(), v, lane_mask, width);
}
/* ROCm 7's 64-bit-mask overloads (CUDA's own take an unsigned 32-bit mask, so overloading is unambiguous). */
template <typename T>
__device__ __forceinline__ T __shfl_down_sync(unsigned long long mask, T v, unsigned int delta, int width) {
    return __shfl_down_sync(__hip_nv_lane_mask(mask), v, delta, width);
}
template <typename T>
__device__ __forceinline__ T __shfl_xor_sync(unsigned long long mask, T v, int lane_mask, int width) {
    return __shfl_xor_sync(__hip_nv_lane_mask(mask), v, lane_mask, width);
}
#define PC_HIP_SHFL_DOWN(mask, v, d, w) __shfl_down_sync((unsigned long long)(mask), (v), (d), (w))
#define PC_HIP_SHFL_XOR(mask, v, m, w) __shfl_xor_sync((unsigned long long)(mask), (v), (m), (w))

/* --- hip_fp16 names (storage conversions only) ------------------------------------------------------- */
struct __half {
    unsigned short __x;
};
__device__ __forceinline__ unsigned short __half_as_ushort(__half h) { return h.__x; }
__device__ __forceinline__ __half __ushort_as_half(unsigned short u) {
    __half h;
    h.__x = u;
    return h;
}
__device__ __forceinline__ float __half2float(__half h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.__x));
    return f;
}
__device__ __forceinline__ __half __float2half_rn(float f) {
    __half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.__x) : "f"(f));
    return h;
}
