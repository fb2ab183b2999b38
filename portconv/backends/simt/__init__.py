"""portconv's CUDA and HIP kernel set (cuda/ bodies behind per-vendor preludes): selection, programs, runtime.

select.py decides (choose: the family; build: a KernelPlan per result, with igemm.py and depthwise.py), view.py
holds the argument block the kernels take, compile.py and runtime.py make and run the programs, cuda.py and hip.py
are the two backends. No module here reads the environment: knobs.env() and Options carry every setting.
"""
