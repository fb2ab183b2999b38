"""Parameter and shape validation with PyTorch's own error texts (Convolution.cpp); device-free."""
from __future__ import annotations

from .errors import ConvError
from .params import ConvParams
from .tensors import TensorSpec


def batchify(input: TensorSpec, num_spatial_dims: int, func_name: str) -> bool:
    """ATen's ``batchify``: True if batched, False if unbatched (rank+1 dims), else PyTorch's error."""
    dim_count_no_batch = num_spatial_dims + 1
    dim_count_batch = dim_count_no_batch + 1
    if input.dim == dim_count_batch:
        return True
    if input.dim == dim_count_no_batch:
        return False
    raise ConvError(f"Expected {dim_count_no_batch}D (unbatched) or {dim_count_batch}D (batched) input to "
                    f"{func_name}, but got input of size: [{', '.join(map(str, input.shape))}]")


def check_forward(input: TensorSpec, weight: TensorSpec, bias: TensorSpec | None, params: ConvParams) -> None:
    """TODO(front end): every check of check_input_same_type_as_parameters and check_shape_forward."""


def check_backward(grad_output: TensorSpec, problem, bias_sizes, output_mask) -> None:
    """TODO(front end): check_shape_backward."""


def is_empty_problem(problem) -> bool:
    return problem.input.shape[0] == 0 or problem.input.shape[1] == 0


def empty_forward(input, weight, bias, params: ConvParams):
    raise NotImplementedError("TODO(front end): empty inputs")


def empty_backward(grad_output, input, weight, params: ConvParams, mask):
    raise NotImplementedError("TODO(front end): empty inputs")
