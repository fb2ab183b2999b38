"""Build the example extension in place: python setup.py build_ext --inplace (needs pybind11 and a C++17 compiler)."""
from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup

setup(name="portconv-example-dwconv", ext_modules=[Pybind11Extension("dwconv", ["dwconv.cpp"], cxx_std=17)])
