// A user's depthwise 2-D convolution forward for the CPU (float32 and float64), as a pybind11 extension.
// portconv.custom_forward makes it a differentiable, compilable torch op whose gradients are portconv's
// (examples/custom_forward_cpp/example.py). Arguments arrive as custom_forward passes them: a batched NCHW input,
// a (C * m, 1, R, S) weight, per-axis stride / padding / dilation, groups == C.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <vector>

namespace py = pybind11;

template <typename T>
py::array_t<T> depthwise_forward(py::array_t<T, py::array::c_style | py::array::forcecast> x,
                                 py::array_t<T, py::array::c_style | py::array::forcecast> w, py::object bias,
                                 std::vector<long> stride, std::vector<long> padding, std::vector<long> dilation,
                                 long groups) {
    if (x.ndim() != 4 || w.ndim() != 4 || stride.size() != 2 || padding.size() != 2 || dilation.size() != 2)
        throw std::invalid_argument("depthwise_forward takes a 4-D input and weight and 2 values per argument");
    const long N = x.shape(0), C = x.shape(1), H = x.shape(2), W = x.shape(3);
    const long K = w.shape(0), R = w.shape(2), S = w.shape(3);
    if (groups != C || w.shape(1) != 1 || K % C != 0)
        throw std::invalid_argument("depthwise_forward: groups must equal the input channels, weight (C*m, 1, R, S)");
    const long m = K / C;
    const long P = (H + 2 * padding[0] - dilation[0] * (R - 1) - 1) / stride[0] + 1;
    const long Q = (W + 2 * padding[1] - dilation[1] * (S - 1) - 1) / stride[1] + 1;
    std::vector<T> b(K, T(0));
    if (!bias.is_none()) {
        auto bb = bias.cast<py::array_t<T, py::array::c_style | py::array::forcecast>>();
        for (long k = 0; k < K; ++k) b[k] = bb.data()[k];
    }
    py::array_t<T> y({N, K, P, Q});
    const T *xp = x.data(), *wp = w.data();
    T *yp = y.mutable_data();
    {
        py::gil_scoped_release release;
        for (long n = 0; n < N; ++n)
            for (long k = 0; k < K; ++k) {
                const long c = k / m;
                const T *xc = xp + (n * C + c) * H * W, *wk = wp + k * R * S;
                T *yk = yp + (n * K + k) * P * Q;
                for (long p = 0; p < P; ++p)
                    for (long q = 0; q < Q; ++q) {
                        T acc = b[k];
                        for (long r = 0; r < R; ++r) {
                            const long h = p * stride[0] - padding[0] + r * dilation[0];
                            if (h < 0 || h >= H) continue;
                            for (long s = 0; s < S; ++s) {
                                const long v = q * stride[1] - padding[1] + s * dilation[1];
                                if (v >= 0 && v < W) acc += xc[h * W + v] * wk[r * S + s];
                            }
                        }
                        yk[p * Q + q] = acc;
                    }
            }
    }
    return y;
}

PYBIND11_MODULE(dwconv, mod) {
    mod.doc() = "A depthwise 2-D convolution forward (CPU), for portconv.custom_forward";
    mod.def("forward_f32", &depthwise_forward<float>);
    mod.def("forward_f64", &depthwise_forward<double>);
}
