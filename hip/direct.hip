/* portconv HIP module: the direct kernels plus bias-grad and split finalize, from the shared bodies in cuda/. */
#include "prelude.h"
#include "types.cuh"
#include "common.cuh"
#include "reduce.cuh"
#include "conv_direct.cuh"
