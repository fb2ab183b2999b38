/* portconv idioms in HIP's device API: the names cuda/prelude.cuh defines, for the shared bodies in cuda/.
 *
 * Included by prelude.h after a platform layer (prelude_amd.h or prelude_nvidia.h) has provided WAVE_SIZE,
 * PC_HIP_FULL_MASK, PC_HIP_SHFL_DOWN/XOR and the hip_fp16 names. Nothing here depends on the platform:
 * on NVIDIA the same lines run through the HIP->CUDA mapping.
 *
 * Note [wave64 in the bodies]: the bodies size every warp-level step from PC_WARP_SIZE (reduce.cuh folds
 * from PC_WARP_SIZE/2, so 6 shuffle steps on wave64, 5 on wave32) and launch blocks that are a multiple of
 * 64 threads (256), so whole waves are always active and the full-wave mask is the right one on both.
 */
#pragma once

#define PC_KERNEL extern "C" __global__
#define PC_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
/* HIP's second __launch_bounds__ argument is not CUDA's (waves per execution unit on AMD): no register cap here */
#define PC_LAUNCH_BOUNDS_MIN(threads, blocks) __launch_bounds__(threads)
#define PC_DEVICE __device__ __forceinline__
#define PC_SHARED __shared__
#define PC_RESTRICT __restrict__
#define PC_BARRIER() __syncthreads()

#define PC_WARP_SIZE WAVE_SIZE

/* Lane masks are 64-bit, as ROCm 7 requires; PC_FULL_MASK is every lane of one wave. */
typedef unsigned long long pc_lanemask_t;
#define PC_FULL_MASK ((pc_lanemask_t)PC_HIP_FULL_MASK)

template <typename T>
PC_DEVICE T pc_shfl_down(T v, int delta) {
    return PC_HIP_SHFL_DOWN(PC_FULL_MASK, v, (unsigned int)delta, PC_WARP_SIZE);
}

template <typename T>
PC_DEVICE T pc_shfl_xor(T v, int mask) {
    return PC_HIP_SHFL_XOR(PC_FULL_MASK, v, mask, PC_WARP_SIZE);
}

/* HIP's atomicAdd on float and double is a device-scope relaxed atomic (a CAS loop where the memory kind
 * needs it), never the unsafe fine-grained variant. */
PC_DEVICE float pc_atomic_add(float *p, float v) { return atomicAdd(p, v); }
PC_DEVICE double pc_atomic_add(double *p, double v) { return atomicAdd(p, v); }

/* 16-bit floats are stored as raw bits (types.cuh). float16 goes through hip_fp16; bfloat16 is the upper
 * half of a float32, rounded to nearest even exactly as cuda/prelude.cuh and hip_bf16.h's __float2bfloat16
 * do. hip_bf16.h exists from ROCm 6 only (ROCm 5 has the differently named hip_bfloat16.h), so the bit form
 * is used on every ROCm version and the results match the CUDA set bit for bit (NaN aside: CUDA's sm_80+
 * cvt.rn.bf16.f32 gives the canonical 0x7fff, this form keeps the sign). */
PC_DEVICE float pc_f16_bits_to_float(unsigned short h) { return __half2float(__ushort_as_half(h)); }
PC_DEVICE unsigned short pc_float_to_f16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

PC_DEVICE float pc_bf16_bits_to_float(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }

PC_DEVICE unsigned short pc_float_to_bf16_bits(float f) {
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

/* Note [async copies] of cuda/prelude.cuh: synchronous copies here (no cp.async). */
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

/* Note [dependent launch] of cuda/prelude.cuh: launches here are always ordered. */
PC_DEVICE void pc_grid_dependency_wait() {}

/* Matrix-core (MFMA/WMMA) tiles are not written for HIP: the bodies use their portable shared-memory tile. */
#ifndef PC_TENSOR_CORES
#define PC_TENSOR_CORES 0
#endif
#if PC_TENSOR_CORES
#error "portconv: PC_TENSOR_CORES paths are CUDA-only (cuda/prelude.cuh Note [tensor cores])"
#endif
