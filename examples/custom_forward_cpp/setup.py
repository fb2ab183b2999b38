"""Build the example extensions in place: python setup.py build_ext --inplace (needs pybind11 and a C++17 compiler).

With DWCONV_CUDA=1 it also builds dwconv_cuda: the CUDA kernel dwconv_cuda.cu compiled by nvcc (from PATH, else
$CUDA_HOME/bin) for DWCONV_CUDA_ARCH (an nvcc -arch value, default sm_90: SASS for sm_90 plus PTX newer GPUs JIT),
its pybind11 binding dwconv_cuda_bind.cpp, and the CUDA runtime linked statically (no library path to set at import).
"""
import os
import pathlib
import shutil

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

modules = [Pybind11Extension("dwconv", ["dwconv.cpp"], cxx_std=17)]
NVCC = None
if os.environ.get("DWCONV_CUDA") == "1":
    home = pathlib.Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    NVCC = shutil.which("nvcc") or str(home / "bin" / "nvcc")
    if not os.path.isfile(NVCC):
        raise SystemExit("DWCONV_CUDA=1: nvcc is neither on PATH nor in $CUDA_HOME/bin")
    roots = [home, pathlib.Path(NVCC).resolve().parents[1]]  # the toolkit $CUDA_HOME names, or nvcc's own
    found = [lib for root in roots for sub in ("lib64", "lib", "targets/x86_64-linux/lib")
             if (lib := root / sub / "libcudart_static.a").is_file()]
    if not found:
        raise SystemExit(f"DWCONV_CUDA=1: libcudart_static.a not found under {', '.join(map(str, roots))}")
    modules.append(Pybind11Extension("dwconv_cuda", ["dwconv_cuda.cu", "dwconv_cuda_bind.cpp"], cxx_std=17,
                                     extra_objects=[str(found[0])], libraries=["dl", "rt", "pthread"]))


class BuildExt(build_ext):
    """build_ext that hands .cu sources to nvcc (position-independent code for DWCONV_CUDA_ARCH) and every other
    source to the C++ compiler as usual."""

    def build_extensions(self):
        self.compiler.src_extensions.append(".cu")
        compile_cpp = self.compiler._compile

        def compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts):
            if ext != ".cu":
                return compile_cpp(obj, src, ext, cc_args, extra_postargs, pp_opts)
            arch = os.environ.get("DWCONV_CUDA_ARCH", "sm_90")
            self.spawn([NVCC, "-c", src, "-o", obj, "-O3", "-std=c++17", f"-arch={arch}", "-Xcompiler", "-fPIC",
                        *pp_opts])

        self.compiler._compile = compile_one
        super().build_extensions()


setup(name="portconv-example-dwconv", ext_modules=modules, cmdclass={"build_ext": BuildExt})
