"""ConvParams: the normalized convolution parameters and output-shape arithmetic (device-free)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .errors import ConvError

IntOrSeq = int | Sequence[int]


def expand_param_if_needed(value: IntOrSeq, fname: str, expected_dim: int) -> tuple[int, ...]:
    """PyTorch's ``expand_param_if_needed`` (ATen/native/utils/ParamUtils.h), same message."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * expected_dim
    vals = tuple(int(v) for v in value)
    if len(vals) == 1:
        return vals * expected_dim
    if len(vals) != expected_dim:
        shown = "[" + ", ".join(str(v) for v in vals) + "]"
        raise ConvError(
            f"expected {fname} to be a single integer value or a list of {expected_dim} values to match the "
            f"convolution dimensions, but got {fname}={shown}"
        )
    return vals


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
             weight_shape: Sequence[int] | None = None) -> ConvParams:
        """Expand every argument to ``rank`` entries; resolve 'same'/'valid' (needs weight_shape)."""
        stride_t = expand_param_if_needed(stride, "stride", rank)
        dilation_t = expand_param_if_needed(dilation, "dilation", rank)
        out_pad = expand_param_if_needed(output_padding, "output_padding", rank)
        extra = (0,) * rank
        if isinstance(padding, str):
            if padding == "valid":
                pad = (0,) * rank
            elif padding == "same":
                if any(s != 1 for s in stride_t):
                    raise ConvError("padding='same' is not supported for strided convolutions")
                if weight_shape is None:
                    raise ConvError("padding='same' needs the weight shape")
                totals = [d * (k - 1) for d, k in zip(dilation_t, weight_shape[2:])]
                pad = tuple(t // 2 for t in totals)
                extra = tuple(t - 2 * (t // 2) for t in totals)
            else:
                raise ConvError(f"Invalid padding string: '{padding}'")
        else:
            pad = expand_param_if_needed(padding, "padding", rank)
        return cls(stride_t, pad, dilation_t, bool(transposed), out_pad, int(groups), extra)

    # --- shape arithmetic -------------------------------------------------------------------
    def output_shape(self, input_shape: Sequence[int], weight_shape: Sequence[int]) -> tuple[int, ...]:
        """PyTorch's conv_output_size / conv_input_size for a batched input shape (N, C, *spatial)."""
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
        return (n, channels, *spatial)

    def is_depthwise(self, input_shape: Sequence[int], weight_shape: Sequence[int]) -> bool:
        """ATen's ``is_depthwise``: non-transposed, groups == C_in > 1, K a multiple of C_in."""
        return (not self.transposed and len(input_shape) >= 3 and input_shape[1] == self.groups
                and self.groups > 1 and weight_shape[0] % input_shape[1] == 0)

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
