/* ROCm 7's warp-sync shuffle declarations, for compile checks on older HIP headers (scripts/hip_build.py).
 *
 * ROCm 7 (amd_warp_sync_functions.h) declares __shfl_*_sync as templates over the mask type and rejects any
 * mask that is not a 64-bit integer with a static_assert. HIP < 6.2 has no such functions, so this shim
 * declares them the same way (forwarding to the mask-less shuffles) and the hip/ sources are compiled with
 * -DPC_HIP_TEST_WARP_SYNC=1: a 32-bit mask anywhere in them fails to compile, as it would on ROCm 7.
 */
#pragma once
#include <hip/hip_runtime.h>

template <typename MaskT, typename T>
__device__ inline T __shfl_down_sync(MaskT mask, T var, unsigned int delta, int width = warpSize) {
    static_assert(sizeof(MaskT) == 8 && MaskT(-1) > MaskT(0), "The mask must be a 64-bit unsigned integer (ROCm 7)");
    (void)mask;
    return __shfl_down(var, delta, width);
}

template <typename MaskT, typename T>
__device__ inline T __shfl_xor_sync(MaskT mask, T var, int lane_mask, int width = warpSize) {
    static_assert(sizeof(MaskT) == 8 && MaskT(-1) > MaskT(0), "The mask must be a 64-bit unsigned integer (ROCm 7)");
    (void)mask;
    return __shfl_xor(var, lane_mask, width);
}
