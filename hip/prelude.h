/* portconv HIP prelude: picks the platform layer, then defines the idioms the shared bodies in cuda/ use.
 *
 * Note [HIP preludes]: every .hip entry file includes this file and then the vendor-neutral bodies from
 * cuda/ (found with -I <cuda folder>); no kernel body is copied into hip/. The layering is HIP's own:
 *   prelude_amd.h     AMD platform: HIP runtime/fp16 headers (hipcc) or none (hiprtc pre-includes them),
 *                     wave size per gfx target, ROCm 7's 64-bit-mask shuffles.
 *   prelude_nvidia.h  NVIDIA platform: the HIP device names mapped onto CUDA, as HIP's nvidia platform does,
 *                     so NVRTC compiles the same sources ("HIP-on-NVIDIA").
 *   prelude_hip.h     the portconv idioms (PC_*, pc_*) written once in HIP's device API; the same names
 *                     cuda/prelude.cuh defines for CUDA.
 * The host may force the platform with -DPC_HIP_ON_NVIDIA=1; otherwise the compiler tells.
 */
#pragma once

#if defined(PC_HIP_ON_NVIDIA) && PC_HIP_ON_NVIDIA
#define PC_HIP_PLATFORM_NVIDIA 1
#elif defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__) || defined(__HIPCC_RTC__) || \
    defined(__AMDGCN__) || (defined(__HIP__) && !defined(__CUDACC__))
#define PC_HIP_PLATFORM_AMD 1
#elif defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(__NVCC__)
#define PC_HIP_PLATFORM_NVIDIA 1
#else
#error "portconv hip/: neither an AMD (hipcc, hiprtc) nor an NVIDIA (nvcc, NVRTC) compiler"
#endif

#if defined(PC_HIP_PLATFORM_NVIDIA)
#include "prelude_nvidia.h"
#else
#include "prelude_amd.h"
#endif

#include "prelude_hip.h"
