// The Python module dwconv_cuda: the CUDA kernel of dwconv_cuda.cu behind pybind11. Tensors arrive as torch's
// addresses and torch's current stream as integers (tensor.data_ptr(), torch.cuda.current_stream().cuda_stream), so
// the extension needs neither torch's C++ API nor a copy: the kernel reads and writes torch's memory, queued on
// torch's stream, and nothing here waits for it.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "dwconv_cuda.h"

namespace py = pybind11;

void forward(std::uintptr_t x, std::uintptr_t w, std::uintptr_t b, std::uintptr_t y, const std::vector<int> &dims,
             bool double_precision, std::uintptr_t stream) {
    if (dims.size() != 15)
        throw std::invalid_argument("dwconv_cuda.forward: dims are N, C, K, H, W, P, Q, R, S, stride h/w, "
                                    "padding h/w, dilation h/w");
    launch_depthwise_forward(reinterpret_cast<const void *>(x), reinterpret_cast<const void *>(w),
                             reinterpret_cast<const void *>(b), reinterpret_cast<void *>(y), dims.data(),
                             double_precision, reinterpret_cast<CUstream_st *>(stream));
}

PYBIND11_MODULE(dwconv_cuda, mod) {
    mod.doc() = "A depthwise 2-D convolution forward (CUDA), for portconv.custom_forward";
    mod.def("forward", &forward, py::arg("x"), py::arg("w"), py::arg("b"), py::arg("y"), py::arg("dims"),
            py::arg("double_precision"), py::arg("stream"),
            "Queue y = depthwise_conv2d(x, w) + b on the stream (addresses as integers; b 0 for no bias)");
}
