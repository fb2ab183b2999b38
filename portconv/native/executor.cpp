// portconv's native executor (Note [native executor], portconv/native/__init__.py): a loaded Program's launches
// and a plan's autograd node in C++. Python builds every Executable (what runs is decided there, at plan time);
// this file allocates the buffers, writes the addresses into copies of the argument blocks and launches, in order,
// on the caller's current stream. It links against torch only: the driver's entry points come from Python as
// addresses, so no CUDA header or library is needed to build it.
#include <torch/extension.h>
#include <torch/csrc/autograd/custom_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <unistd.h>

#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// Roles: the call's operands first (program.OPERANDS order), then the Program's buffers in order.
constexpr int kInput = 0, kWeight = 1, kBias = 2, kGradOutput = 3, kOperands = 4;

// The driver's entry points (CUDA's signatures; the emulator's launch for the CPU tests).
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                        void **);
struct LaunchAttribute {  // CUlaunchAttribute: an id, padding, a 64-byte value union
    int id;
    char pad[4];
    int value[16];
};
struct LaunchConfig {  // CUlaunchConfig
    unsigned grid[3], block[3], shared;
    void *stream;
    LaunchAttribute *attrs;
    unsigned count;
};
typedef int (*launch_ex_t)(const LaunchConfig *, void *, void **, void **);
typedef int (*emu_launch_t)(void *, unsigned, unsigned, unsigned, unsigned, const void *);
typedef int (*ctx_get_t)(void **);
typedef int (*ctx_set_t)(void *);
typedef int (*error_name_t)(int, const char **);

enum Kind { kLaunch = 0, kLaunchEx = 1, kEmulator = 2 };  // how a step launches (Note [dependent launch]: kLaunchEx)

struct Driver {
    launch_t launch = nullptr;
    launch_ex_t launch_ex = nullptr;
    ctx_get_t ctx_get = nullptr;
    ctx_set_t ctx_set = nullptr;
    error_name_t error_name = nullptr;
};

struct Buffer {
    int role;
    std::vector<int64_t> shape, strides;
    at::ScalarType dtype;
    bool result, always_nan;  // always_nan: filled with NaN on every call (the emulator's workspaces)
};

struct Step {
    std::vector<int64_t> args;                // the argument block, address fields zero
    std::vector<std::pair<int, int>> binds;   // (slot, role)
    void *fn;                                 // CUfunction, or the emulated kernel
    unsigned grid[3], block[3];
    int kind;
    void *emu;                                // kEmulator: the emulator's launch
};

at::ScalarType dtype_of(const std::string &name) {
    static const std::map<std::string, at::ScalarType> names = {
        {"float16", at::kHalf}, {"bfloat16", at::kBFloat16}, {"float32", at::kFloat}, {"float64", at::kDouble},
        {"int32", at::kInt}, {"int64", at::kLong}, {"uint8", at::kByte}, {"int8", at::kChar}};
    auto it = names.find(name);
    if (it == names.end()) throw std::invalid_argument("portconv native executor: no dtype " + name);
    return it->second;
}

template <typename T> T fn_at(int64_t address) { return reinterpret_cast<T>(static_cast<intptr_t>(address)); }

// One loaded Program (program.Program, runtime.Loader.load_native): what runtime.Executable does, in C++.
class Executable {
  public:
    Executable(int device, int64_t ctx, py::list buffers, py::list steps, std::vector<int> outputs, py::tuple driver,
               bool poison, py::object fork_check)
        : device_(device), ctx_(fn_at<void *>(ctx)), outputs_(std::move(outputs)), poison_(poison),
          pid_(getpid()), fork_check_(std::move(fork_check)) {
        driver_.launch = fn_at<launch_t>(driver[0].cast<int64_t>());
        driver_.launch_ex = fn_at<launch_ex_t>(driver[1].cast<int64_t>());
        driver_.ctx_get = fn_at<ctx_get_t>(driver[2].cast<int64_t>());
        driver_.ctx_set = fn_at<ctx_set_t>(driver[3].cast<int64_t>());
        driver_.error_name = fn_at<error_name_t>(driver[4].cast<int64_t>());
        for (auto b : buffers) {
            auto t = b.cast<py::tuple>();
            buffers_.push_back({t[0].cast<int>(), t[1].cast<std::vector<int64_t>>(), t[2].cast<std::vector<int64_t>>(),
                                dtype_of(t[3].cast<std::string>()), t[4].cast<bool>(), t[5].cast<bool>()});
        }
        for (auto s : steps) {
            auto t = s.cast<py::tuple>();
            Step step;
            step.args = t[0].cast<std::vector<int64_t>>();
            step.binds = t[1].cast<std::vector<std::pair<int, int>>>();
            step.fn = fn_at<void *>(t[2].cast<int64_t>());
            auto grid = t[3].cast<std::vector<unsigned>>(), block = t[4].cast<std::vector<unsigned>>();
            for (int i = 0; i < 3; ++i) {
                step.grid[i] = i < (int)grid.size() ? grid[i] : 1;
                step.block[i] = i < (int)block.size() ? block[i] : 1;
            }
            step.kind = t[5].cast<int>();
            step.emu = fn_at<void *>(t[6].cast<int64_t>());
            for (auto &b : step.binds)
                if (b.first < 0 || b.first >= (int)step.args.size() || b.second < 0 ||
                    b.second >= kOperands + (int)buffers_.size())
                    throw std::invalid_argument("portconv native executor: a bind outside its argument block");
            steps_.push_back(std::move(step));
        }
    }

    ~Executable() {
        if (Py_IsInitialized()) {
            py::gil_scoped_acquire gil;
            fork_check_ = py::object();
        } else {
            fork_check_.release();
        }
    }

    // vals: the operands (kOperands, undefined where absent); returns the outputs (undefined where None).
    std::vector<at::Tensor> run(std::vector<at::Tensor> vals) const {
        if (getpid() != pid_) {  // Note [fork]: Python raises the error that says why and what to do
            py::gil_scoped_acquire gil;
            fork_check_("CUDA/HIP kernels");
            throw std::runtime_error("portconv: a plan loaded before fork() was called in the child");
        }
        vals.resize(kOperands + buffers_.size());
        const auto device = device_ >= 0 ? c10::Device(c10::kCUDA, device_) : c10::Device(c10::kCPU);
        for (const Buffer &b : buffers_) {
            at::Tensor t = at::empty_strided(b.shape, b.strides, at::TensorOptions().dtype(b.dtype).device(device));
            if ((poison_ && b.result) || b.always_nan) t.fill_(NAN);
            vals[b.role] = std::move(t);
        }
        void *stream = nullptr;
        if (device_ >= 0)
            stream = c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(device).native_handle();
        void *old = nullptr;
        bool switched = false;
        if (ctx_ != nullptr) {  // the device's primary context, made current for the call where it is not
            check(driver_.ctx_get(&old), "cuCtxGetCurrent");
            if (old != ctx_) check(driver_.ctx_set(ctx_), "cuCtxSetCurrent"), switched = true;
        }
        try {
            std::vector<int64_t> block;
            for (const Step &s : steps_) {
                block = s.args;
                for (const auto &b : s.binds) block[b.first] = reinterpret_cast<intptr_t>(vals[b.second].data_ptr());
                void *address = block.data();
                void *params[] = {address};
                if (s.kind == kEmulator) {
                    if (fn_at<emu_launch_t>(reinterpret_cast<intptr_t>(s.emu))(s.fn, s.grid[0], s.grid[1], s.grid[2],
                                                                               s.block[0], address))
                        throw std::runtime_error("the emulated kernel deadlocked at a barrier");
                } else if (s.kind == kLaunchEx) {
                    LaunchAttribute attr{};
                    attr.id = 6;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                    attr.value[0] = 1;
                    LaunchConfig cfg{{s.grid[0], s.grid[1], s.grid[2]}, {s.block[0], s.block[1], s.block[2]}, 0,
                                     stream, &attr, 1};
                    check(driver_.launch_ex(&cfg, s.fn, params, nullptr),
                          "cuLaunchKernelEx (Note [dependent launch])");
                } else {
                    check(driver_.launch(s.fn, s.grid[0], s.grid[1], s.grid[2], s.block[0], s.block[1], s.block[2], 0,
                                         stream, params, nullptr),
                          "cuLaunchKernel");
                }
            }
        } catch (...) {
            if (switched) driver_.ctx_set(old);
            throw;
        }
        if (switched) check(driver_.ctx_set(old), "cuCtxSetCurrent");
        std::vector<at::Tensor> out;
        for (int r : outputs_) out.push_back(r >= 0 ? vals[r] : at::Tensor());
        return out;
    }

  private:
    void check(int rc, const char *what) const {  // nvidia.check's message
        if (rc == 0) return;
        const char *name = nullptr;
        if (driver_.error_name != nullptr) driver_.error_name(rc, &name);
        throw std::runtime_error(std::string(what) + " failed: " + (name ? name : "?") + " (" + std::to_string(rc) +
                                 ")");
    }

    int device_;  // -1: CPU tensors (the emulator)
    void *ctx_;
    std::vector<Buffer> buffers_;
    std::vector<Step> steps_;
    std::vector<int> outputs_;
    Driver driver_;
    bool poison_;
    pid_t pid_;
    py::object fork_check_;
};

bool plain(const at::Tensor &t) {  // a strided tensor with memory of its own: no wrapper, batched or subclass
    return t.layout() == at::kStrided && t.has_storage() && !t.key_set().has(c10::DispatchKey::Python);
}

at::Tensor resolved(const at::Tensor &t) { return t.defined() && t.is_neg() ? t.resolve_neg() : t; }

// A plan's calls on the native executor: ProgramRunner's executable per (call, mask, operand layouts), the
// Executable of a layout made by Python at its first call (ProgramRunner.native_executable), kept here after.
class Runner : public torch::CustomClassHolder {
  public:
    Runner(py::object build, py::object slow) : build_(std::move(build)), slow_(std::move(slow)) {}

    ~Runner() {
        if (Py_IsInitialized()) {
            py::gil_scoped_acquire gil;
            build_ = py::object();
            slow_ = py::object();
        } else {
            build_.release();
            slow_.release();
        }
    }

    at::Tensor forward(const at::Tensor &input, const at::Tensor &weight, const at::Tensor &bias_in) {
        at::Tensor x = resolved(input), w = resolved(weight), b = resolved(bias_in);
        if (b.defined() && b.scalar_type() != x.scalar_type()) b = b.to(x.scalar_type());  // validate.py's Note
        std::vector<at::Tensor> ops{x, w, b, at::Tensor()};
        return executable(forward_, "forward", 0, ops)->run(ops)[0];
    }

    std::vector<at::Tensor> backward(const at::Tensor &grad_output, const at::Tensor &input,
                                     const at::Tensor &weight, std::array<bool, 3> mask) {
        if (!mask[0] && !mask[1] && !mask[2]) return {at::Tensor(), at::Tensor(), at::Tensor()};
        std::vector<at::Tensor> ops{resolved(input), resolved(weight), at::Tensor(), resolved(grad_output)};
        int bits = mask[0] | mask[1] << 1 | mask[2] << 2;
        return executable(backward_, "backward", bits, ops)->run(ops);
    }

    // The differentiable backward (autograd.native_slow): create_graph, and operands that are not plain tensors.
    std::vector<at::Tensor> slow(const at::Tensor &grad_output, const at::Tensor &input, const at::Tensor &weight,
                                 std::array<bool, 3> mask) {
        py::gil_scoped_acquire gil;
        auto r = slow_(grad_output, input, weight, py::make_tuple(mask[0], mask[1], mask[2])).cast<py::tuple>();
        std::vector<at::Tensor> out;
        for (auto g : r) out.push_back(g.is_none() ? at::Tensor() : g.cast<at::Tensor>());
        return out;
    }

    size_t size() {
        std::lock_guard<std::mutex> lock(mu_);
        return forward_.size() + backward_.size();
    }

  private:
    using Key = std::vector<int64_t>;
    using Table = std::map<Key, std::shared_ptr<Executable>>;

    // runtime.Loader.key of each operand (its element strides and its address modulo 16), and the mask.
    static Key key_of(int bits, const std::vector<at::Tensor> &ops) {
        Key key{bits};
        for (const at::Tensor &t : ops) {
            if (!t.defined()) {
                key.push_back(-1);
                continue;
            }
            if (!plain(t)) throw std::invalid_argument("portconv native executor: an operand is not a plain tensor");
            key.push_back(t.dim());
            for (auto s : t.strides()) key.push_back(s);
            key.push_back(reinterpret_cast<intptr_t>(t.data_ptr()) & 15);
        }
        return key;
    }

    std::shared_ptr<Executable> executable(Table &table, const char *call, int bits, const std::vector<at::Tensor> &ops) {
        Key key = key_of(bits, ops);
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = table.find(key);
            if (it != table.end()) return it->second;
        }
        std::shared_ptr<Executable> made;
        {  // never under mu_: the main thread may hold the GIL and wait for mu_
            py::gil_scoped_acquire gil;
            py::object mask = bits == 0 ? py::object(py::tuple())
                                        : py::object(py::make_tuple(bool(bits & 1), bool(bits & 2), bool(bits & 4)));
            py::tuple operands = std::string(call) == "forward"
                                     ? py::make_tuple(opt(ops[kInput]), opt(ops[kWeight]), opt(ops[kBias]))
                                     : py::make_tuple(opt(ops[kGradOutput]), opt(ops[kInput]), opt(ops[kWeight]));
            made = build_(call, mask, operands).cast<std::shared_ptr<Executable>>();
        }
        std::lock_guard<std::mutex> lock(mu_);
        return table.emplace(std::move(key), made).first->second;
    }

    static py::object opt(const at::Tensor &t) { return t.defined() ? py::cast(t) : py::none(); }

    py::object build_, slow_;
    Table forward_, backward_;
    std::mutex mu_;
};

// y = conv(input, weight, bias) recorded by autograd with portconv's backward (Note [native executor]).
struct Conv : public torch::autograd::Function<Conv> {
    // bias: optional, so that an absent bias is no input of the node (its edges: input, weight[, bias])
    static at::Tensor forward(AutogradContext *ctx, at::Tensor input, at::Tensor weight,
                              std::optional<at::Tensor> bias, c10::intrusive_ptr<Runner> runner) {
        ctx->set_materialize_grads(false);
        ctx->save_for_backward({input, weight});
        ctx->saved_data["has_bias"] = bias.has_value();
        at::Tensor out = runner->forward(input, weight, bias.has_value() ? *bias : at::Tensor());
        ctx->saved_data["runner"] = at::IValue::make_capsule(std::move(runner));
        return out;
    }

    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        const at::Tensor &go = grads[0];
        std::array<bool, 3> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                 ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)};
        if (!go.defined() || !(mask[0] || mask[1] || mask[2])) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
        auto saved = ctx->get_saved_variables();
        auto runner = c10::static_intrusive_pointer_cast<Runner>(ctx->saved_data["runner"].toCapsule());
        std::vector<at::Tensor> g = at::GradMode::is_enabled() || !plain(go)
                                        ? runner->slow(go, saved[0], saved[1], mask)
                                        : runner->backward(go, saved[0], saved[1], mask);
        return {g[0], g[1], g[2], at::Tensor()};
    }
};

at::Tensor conv(const c10::intrusive_ptr<Runner> &runner, const at::Tensor &input, const at::Tensor &weight,
                const std::optional<at::Tensor> &bias) {
    at::Tensor b = bias.has_value() ? *bias : at::Tensor();
    if (at::GradMode::is_enabled() &&
        (input.requires_grad() || weight.requires_grad() || (b.defined() && b.requires_grad())))
        return Conv::apply(input, weight, b.defined() ? bias : std::nullopt, runner);
    return runner->forward(input, weight, b);
}

std::optional<at::Tensor> opt_of(const at::Tensor &t) {
    return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    py::class_<Executable, std::shared_ptr<Executable>>(m, "Executable")
        .def(py::init<int, int64_t, py::list, py::list, std::vector<int>, py::tuple, bool, py::object>())
        .def("__call__", [](const Executable &e, std::vector<std::optional<at::Tensor>> operands) {
            std::vector<at::Tensor> vals;
            for (auto &t : operands) vals.push_back(t.has_value() ? *t : at::Tensor());
            std::vector<std::optional<at::Tensor>> out;
            for (auto &t : e.run(vals)) out.push_back(opt_of(t));
            return out;
        });
    py::class_<Runner, c10::intrusive_ptr<Runner>>(m, "Runner")
        .def(py::init<py::object, py::object>())
        .def("forward", [](Runner &r, const at::Tensor &x, const at::Tensor &w, const std::optional<at::Tensor> &b) {
            return r.forward(x, w, b.has_value() ? *b : at::Tensor());
        })
        .def("backward", [](Runner &r, const at::Tensor &go, const at::Tensor &x, const at::Tensor &w,
                            std::array<bool, 3> mask) {
            auto g = r.backward(go, x, w, mask);
            return py::make_tuple(opt_of(g[0]), opt_of(g[1]), opt_of(g[2]));
        })
        .def("conv", [](const c10::intrusive_ptr<Runner> &r, const at::Tensor &x, const at::Tensor &w,
                        const std::optional<at::Tensor> &b) { return conv(r, x, w, b); })
        .def("size", &Runner::size);
}
