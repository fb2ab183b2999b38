/* portconv kernel bodies: element and index types selected by -D defines (vendor-neutral; needs a prelude).
 *
 *   PC_DTYPE    0 float32, 1 float64, 2 float16, 3 bfloat16 (the half types accumulate in float32)
 *   PC_INDEX64  1: 64-bit index arithmetic (any tensor with 2**31 or more elements or offsets); default 0
 */
#pragma once

#ifndef PC_DTYPE
#define PC_DTYPE 0
#endif
#ifndef PC_INDEX64
#define PC_INDEX64 0
#endif

struct pc_half {
    unsigned short bits;
};
struct pc_bfloat16 {
    unsigned short bits;
};

#if PC_DTYPE == 0
typedef float pc_t;
typedef float pc_acc_t;
#elif PC_DTYPE == 1
typedef double pc_t;
typedef double pc_acc_t;
#elif PC_DTYPE == 2
typedef pc_half pc_t;
typedef float pc_acc_t;
#elif PC_DTYPE == 3
typedef pc_bfloat16 pc_t;
typedef float pc_acc_t;
#else
#error "PC_DTYPE must be 0 (float32), 1 (float64), 2 (float16) or 3 (bfloat16)"
#endif

#if PC_INDEX64
typedef long long pc_idx;
#else
typedef int pc_idx;
#endif

PC_DEVICE float pc_ld(const float *p, pc_idx i) { return p[i]; }
PC_DEVICE double pc_ld(const double *p, pc_idx i) { return p[i]; }
PC_DEVICE float pc_ld(const pc_half *p, pc_idx i) { return pc_f16_bits_to_float(p[i].bits); }
PC_DEVICE float pc_ld(const pc_bfloat16 *p, pc_idx i) { return pc_bf16_bits_to_float(p[i].bits); }

PC_DEVICE void pc_st(float *p, pc_idx i, float v) { p[i] = v; }
PC_DEVICE void pc_st(double *p, pc_idx i, double v) { p[i] = v; }
PC_DEVICE void pc_st(pc_half *p, pc_idx i, float v) { p[i].bits = pc_float_to_f16_bits(v); }
PC_DEVICE void pc_st(pc_bfloat16 *p, pc_idx i, float v) { p[i].bits = pc_float_to_bf16_bits(v); }
