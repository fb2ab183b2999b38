/* portconv HIP module: the depthwise kernels plus bias-grad and split finalize, from the shared bodies in cuda/. */
#include "prelude.h"
#include "types.cuh"
#include "common.cuh"
#include "reduce.cuh"
#include "conv_depthwise.cuh"
#include "conv_depthwise_tile.cuh"
#include "conv_depthwise_planes.cuh"
#include "conv_depthwise_bands.cuh"
