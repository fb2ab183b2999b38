/* portconv CUDA module: the depthwise kernels plus bias-grad and split finalize (one compile per -D set). */
#include "prelude.cuh"
#include "types.cuh"
#include "common.cuh"
#include "reduce.cuh"
#include "conv_depthwise.cuh"
#include "conv_depthwise_tile.cuh"
#include "conv_depthwise_planes.cuh"
#include "conv_depthwise_bands.cuh"
