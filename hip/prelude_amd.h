/* portconv HIP platform layer for AMD GPUs: headers, the wave size of the gfx target, shuffle flavour.
 *
 * Included by prelude.h only; prelude_hip.h then defines the portconv idioms on top of what this provides:
 *   WAVE_SIZE           64 on GCN/CDNA (gfx9: gfx90a, gfx940/942, gfx950), 32 on RDNA (gfx10-12) unless built
 *                       with -mwavefrontsize64. The host passes -DWAVE_SIZE from the device's arch; without
 *                       it the target macros decide. A WAVE_SIZE that disagrees with the target is an error.
 *   PC_HIP_FULL_MASK    every lane of one wave, as a 64-bit mask (the low 32 bits on wave32).
 *   PC_HIP_SHFL_DOWN / PC_HIP_SHFL_XOR (mask, v, lane, width)
 *                       Note [ROCm 7 shuffles]: ROCm 7 enables __shfl_*_sync by default and static_asserts a
 *                       64-bit mask (6.2-6.4 had them behind HIP_ENABLE_WARP_SYNC_BUILTINS; before 6.2 only
 *                       the mask-less __shfl_*). We use the _sync form wherever it exists, always with a
 *                       64-bit mask, and the mask-less form elsewhere; waves run in lock-step either way.
 */
#pragma once

#if defined(__HIPCC_RTC__)
/* hiprtc pre-includes hip_runtime.h and hip_fp16.h (ROCm >= 4.4) but not the version macros; the host also
 * passes the runtime's version as PC_HIP_VERSION in case the header is not on hiprtc's include path. */
#if defined(__has_include)
#if __has_include(<hip/hip_version.h>)
#include <hip/hip_version.h>
#endif
#endif
#else
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#endif

#if defined(HIP_VERSION)
#define PC_HIP_VERSION_NUM HIP_VERSION
#elif defined(PC_HIP_VERSION)
#define PC_HIP_VERSION_NUM PC_HIP_VERSION
#else
#define PC_HIP_VERSION_NUM 0
#endif

#define PC_VENDOR_HIP 1
#define PC_HIP_AMD 1

/* --- wave size --------------------------------------------------------------------------------------- */
#if defined(__HIP_DEVICE_COMPILE__)
#if defined(__GFX9__)
#define PC_HIP_TARGET_WAVE 64 /* GCN/CDNA run wave64 only */
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define PC_HIP_TARGET_WAVE __AMDGCN_WAVEFRONT_SIZE /* RDNA: 32 unless -mwavefrontsize64 */
#elif defined(__GFX10__) || defined(__GFX11__) || defined(__GFX12__)
#define PC_HIP_TARGET_WAVE 32
#endif
#endif

#ifndef WAVE_SIZE
#ifdef PC_HIP_TARGET_WAVE
#define WAVE_SIZE PC_HIP_TARGET_WAVE
#else
#define WAVE_SIZE 64 /* host pass of a hipcc build: no device code is generated with it */
#endif
#endif

#if WAVE_SIZE != 32 && WAVE_SIZE != 64
#error "portconv: WAVE_SIZE must be 32 or 64 on AMD GPUs"
#endif
#if defined(PC_HIP_TARGET_WAVE) && WAVE_SIZE != PC_HIP_TARGET_WAVE
#error "portconv: WAVE_SIZE disagrees with the wavefront size of the gfx target being compiled"
#endif

#if WAVE_SIZE == 64
#define PC_HIP_FULL_MASK 0xffffffffffffffffull
#else
#define PC_HIP_FULL_MASK 0x00000000ffffffffull
#endif

/* --- shuffles (Note [ROCm 7 shuffles]) --------------------------------------------------------------- */
#if defined(PC_HIP_TEST_WARP_SYNC)
#define PC_HIP_WARP_SYNC 1 /* scripts/hip_build.py: type-check the 64-bit-mask calls on older headers */
#elif PC_HIP_VERSION_NUM < 60200000
#define PC_HIP_WARP_SYNC 0
#elif PC_HIP_VERSION_NUM < 70000000
#if defined(HIP_ENABLE_WARP_SYNC_BUILTINS)
#define PC_HIP_WARP_SYNC 1
#else
#define PC_HIP_WARP_SYNC 0
#endif
#elif defined(HIP_DISABLE_WARP_SYNC_BUILTINS)
#define PC_HIP_WARP_SYNC 0
#else
#define PC_HIP_WARP_SYNC 1
#endif

#if PC_HIP_WARP_SYNC
#define PC_HIP_SHFL_DOWN(mask, v, d, w) __shfl_down_sync((unsigned long long)(mask), (v), (d), (w))
#define PC_HIP_SHFL_XOR(mask, v, m, w) __shfl_xor_sync((unsigned long long)(mask), (v), (m), (w))
#else
#define PC_HIP_SHFL_DOWN(mask, v, d, w) __shfl_down((v), (d), (w))
#define PC_HIP_SHFL_XOR(mask, v, m, w) __shfl_xor((v), (m), (w))
#endif
