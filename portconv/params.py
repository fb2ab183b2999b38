"""ConvParams: the normalized convolution parameters and output-shape arithmetic (device-free)."""
from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence

from .errors import ConvError

IntOrSeq = int | Sequence[int]


def _sizes(values: Sequence[int]) -> str:
    """c10's ``operator<<`` for an IntArrayRef: ``[1, 2, 3]``."""
    return "[" + ", ".join(str(v) for v in values) + "]"


def _int_list(value: IntOrSeq, fname: str, rank: int) -> list[int]:
    """What Python's argument parser hands to ATen: an int becomes ``rank`` copies, a sequence stays as it is."""
    if isinstance(value, bool):
        raise TypeError(f"argument '{fname}' must be tuple of ints, not bool")
    if isinstance(value, str):
        raise TypeError(f"argument '{fname}' must be tuple of ints, not str")
    if not isinstance(value, (tuple, list)) and hasattr(type(value), "__index__"):  # no exception on the common path:
        return [operator.index(value)] * rank  # torch.compile traces this, and older dynamo cannot catch one
    try:
        return [operator.index(v) for v in value]
    except TypeError:
        raise TypeError(f"argument '{fname}' must be tuple of ints, not {type(value).__name__}") from None


def expand_param_if_needed(value: IntOrSeq, fname: str, expected_dim: int) -> tuple[int, ...]:
    """PyTorch's ``expand_param_if_needed`` (ATen/native/utils/ParamUtils.h), same message."""
    vals = _int_list(value, fname, expected_dim)
    if len(vals) == 1:
        return tuple(vals) * expected_dim
    if len(vals) != expected_dim:
        raise ConvError(
            f"expected {fname} to be a single integer value or a list of {expected_dim} values to match the "
            f"convolution dimensions, but got {fname}={_sizes(vals)}"
        )
    return tuple(vals)


def same_padding(kernel: Sequence[int], dilation: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ATen's ``pooling_same_mode_padding_lr`` for stride 1: (low padding, extra high-side padding) per dim.

    C++ integer division truncates toward zero; that only matters for negative dilations, which then fail
    check_shape_forward's "negative padding" check exactly as in PyTorch.
    """
    totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
    low = tuple(int(t / 2) for t in totals)
    return low, tuple(t - 2 * lo for t, lo in zip(totals, low))


# Note [ConvParams.make and PyTorch's call chain]
# make() follows what torch.nn.functional.convNd / aten::convolution do before check_shape_forward, in the
# same order, so the first error is the same one PyTorch reports:
#   1. ``weight should have at least three dimensions`` (_convolution / convolution_same);
#   2. padding='same' (convolution_same): groups, input rank, stride/dilation broadcast, stride == 1;
#   3. ``non-positive groups is not supported`` (_convolution; convolution_backward skips it and lets
#      check_shape_forward say "expected groups to be greater than 0" instead: ``backward=True``);
#   4. expand_param_if_needed for stride, padding, dilation, output_padding, to the *weight's* spatial rank.
# ``rank`` is the spatial rank of the caller (2 for conv2d): like Python's argument parser for ``int[2]``, an
# int argument becomes ``rank`` copies before step 4, so conv2d with a 3-d weight fails as torch's does.


@dataclasses.dataclass(frozen=True)
class ConvParams:
    """Normalized parameters of an N-d convolution (N = len(stride)).

    ``padding`` is the low-side padding of every spatial dim; ``padding_extra`` is additional
    high-side padding that only ``padding='same'`` with an even effective kernel produces
    (PyTorch pads the input on the right in that case). Kernels never read it: it only changes
    the output extent.
    """

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    groups: int = 1
    padding_extra: tuple[int, ...] = ()

    def __post_init__(self):
        n = len(self.stride)
        if not self.output_padding:
            object.__setattr__(self, "output_padding", (0,) * n)
        if not self.padding_extra:
            object.__setattr__(self, "padding_extra", (0,) * n)

    @property
    def rank(self) -> int:
        return len(self.stride)

    @classmethod
    def make(cls, rank: int, stride: IntOrSeq = 1, padding: IntOrSeq | str = 0, dilation: IntOrSeq = 1,
             transposed: bool = False, output_padding: IntOrSeq = 0, groups: int = 1,
             weight_shape: Sequence[int] | None = None, input_shape: Sequence[int] | None = None,
             backward: bool = False) -> ConvParams:
        """Expand every argument and resolve 'same'/'valid' with PyTorch's checks and texts.

        ``rank`` is the caller's spatial rank; with ``weight_shape`` the expansion follows the weight's rank
        (Note [ConvParams.make and PyTorch's call chain]). ``input_shape`` (batched) lets padding='same' check
        the input rank first, as convolution_same does. ``backward=True`` follows convolution_backward.
        """
        try:
            groups = operator.index(groups)
        except TypeError:  # PyTorch's text, less the function's name its argument parser puts first
            raise TypeError(f"argument 'groups' must be int, not {type(groups).__name__}") from None
        if isinstance(padding, str):
            if transposed:
                raise TypeError("argument 'padding' must be tuple of ints, not str")
            if padding not in ("same", "valid"):
                raise ConvError(f"Invalid padding string: '{padding}'")
        dim = rank
        if weight_shape is not None:
            if len(weight_shape) < 3:
                raise ConvError("weight should have at least three dimensions")
            dim = len(weight_shape) - 2
        extra = (0,) * dim
        if isinstance(padding, str):
            if padding == "same":
                stride_l, dilation_l = _same_checks(rank, dim, stride, dilation, groups, weight_shape, input_shape)
                stride = stride_l if len(stride_l) == dim else stride_l * dim
                dilation_l = dilation_l if len(dilation_l) == dim else dilation_l * dim
                padding, extra = same_padding(weight_shape[2:], dilation_l)
            else:
                padding = [0]
            output_padding = [0]
        if groups <= 0 and not backward:
            raise ConvError("non-positive groups is not supported")
        stride_t = expand_param_if_needed(_int_list(stride, "stride", rank), "stride", dim)
        pad_t = expand_param_if_needed(_int_list(padding, "padding", rank), "padding", dim)
        dilation_t = expand_param_if_needed(_int_list(dilation, "dilation", rank), "dilation", dim)
        out_pad = expand_param_if_needed(_int_list(output_padding, "output_padding", rank), "output_padding", dim)
        return cls(stride_t, pad_t, dilation_t, bool(transposed), out_pad, groups, extra)

    # --- shape arithmetic -------------------------------------------------------------------
    def output_shape(self, input_shape: Sequence[int], weight_shape: Sequence[int]) -> tuple[int, ...]:
        """The shape aten::convolution returns for a batched input (N, C, *spatial).

        conv_output_size / conv_input_size, with 'same''s extra padding, and calc_output_size's rule that an
        input with zero channels gives an output with zero channels.
        """
        n = input_shape[0]
        if self.transposed:
            channels = weight_shape[1] * self.groups
            spatial = tuple(
                (i - 1) * s - 2 * p + d * (k - 1) + op + 1
                for i, s, p, d, k, op in zip(input_shape[2:], self.stride, self.padding, self.dilation,
                                             weight_shape[2:], self.output_padding)
            )
        else:
            channels = weight_shape[0]
            spatial = tuple(
                (i + 2 * p + e - d * (k - 1) - 1) // s + 1
                for i, s, p, e, d, k in zip(input_shape[2:], self.stride, self.padding, self.padding_extra,
                                            self.dilation, weight_shape[2:])
            )
        if input_shape[1] == 0:
            channels = 0
        return (n, channels, *spatial)

    def is_depthwise(self, input_shape: Sequence[int], weight_shape: Sequence[int]) -> bool:
        """ATen's ``is_depthwise``: non-transposed, groups == C_in > 1, K a multiple of C_in."""
        return (not self.transposed and len(input_shape) >= 3 and input_shape[1] == self.groups
                and self.groups > 1 and weight_shape[0] % input_shape[1] == 0)

    def as_2d(self, with_extra: bool = True) -> ConvParams:
        """ATen's view1d_as_2d for a 1-d problem: a leading spatial dim of size-1 kernel, stride 1, no padding.
        ``with_extra=False`` drops padding='same''s extra padding (for callers that already padded the input)."""
        extra = (0,) + self.padding_extra if with_extra else (0,) * (self.rank + 1)
        return ConvParams((1,) + self.stride, (0,) + self.padding, (1,) + self.dilation, self.transposed,
                          (0,) + self.output_padding, self.groups, extra)

    def as_aten(self) -> dict:
        """Keyword arguments for ``torch.ops.aten.convolution`` (padding_extra must be zero)."""
        return dict(stride=list(self.stride), padding=list(self.padding), dilation=list(self.dilation),
                    transposed=self.transposed, output_padding=list(self.output_padding), groups=self.groups)

    def describe(self) -> str:
        parts = [f"stride={list(self.stride)}", f"padding={list(self.padding)}", f"dilation={list(self.dilation)}"]
        if any(self.padding_extra):
            parts.append(f"padding_extra={list(self.padding_extra)}")
        if self.transposed:
            parts += ["transposed", f"output_padding={list(self.output_padding)}"]
        if self.groups != 1:
            parts.append(f"groups={self.groups}")
        return ", ".join(parts)


def _same_checks(rank, dim, stride, dilation, groups, weight_shape, input_shape) -> tuple[list[int], list[int]]:
    """convolution_same's checks before it pads (Convolution.cpp), in its order; returns stride and dilation."""
    if weight_shape is None:
        raise ConvError("padding='same' needs the weight shape")
    if groups <= 0:
        raise ConvError("non-positive groups is not supported")
    k = len(weight_shape)
    if input_shape is not None and len(input_shape) != k:
        raise ConvError(f"Expected {k}-dimensional input for {k}-dimensional weight{_sizes(weight_shape)}, but got "
                        f"{len(input_shape)}-dimensional input of size {_sizes(input_shape)} instead")
    stride_l, dilation_l = _int_list(stride, "stride", rank), _int_list(dilation, "dilation", rank)
    if len(stride_l) not in (dim, 1):
        raise ConvError(f"stride cannot broadcast to {dim} dimensions")
    if len(dilation_l) not in (dim, 1):
        raise ConvError(f"dilation cannot broadcast to {dim} dimensions")
    if any(s != 1 for s in stride_l):
        raise ConvError("padding='same' is not supported for strided convolutions")
    return stride_l, dilation_l
