"""Torch's native BatchNorm kernels put to work on rows: sums and affine maps shared by both modes.

The ghost layer treats each group's channel as one "row" of a native kernel; the exact layer
passes the native backward kernel the unit weight it reads even when it forms no input gradient
(CUDA reads its device). Everything here is a pure tensor function.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["NATIVE_DTYPES", "accumulator_dtype", "affine_rows", "row_sums", "unit_rows"]


def accumulator_dtype(input: torch.Tensor) -> torch.dtype:
    """The dtype sums over a group accumulate in: float64 for float64, else float32 (a float16
    sum of ~1e5 squares would overflow)."""
    return torch.float64 if input.dtype == torch.float64 else torch.float32


#: The dtypes torch's CPU BatchNorm kernels serve in :func:`row_sums` and :func:`affine_rows`.
NATIVE_DTYPES = (torch.float32, torch.float64)


@functools.lru_cache(maxsize=32)
def unit_rows(
    rows: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros and ones of ``rows`` values: the unit statistics the kernels below run with (only
    read, so one pair per shape serves every call)."""
    return (
        torch.zeros(rows, dtype=dtype, device=device),
        torch.ones(rows, dtype=dtype, device=device),
    )


def row_sums(values: torch.Tensor, centred: torch.Tensor) -> torch.Tensor:
    """``[2, groups, C]``: ``sum(values)``, ``sum(values * centred)`` per group and channel.

    Both ``[groups, size, C, S]``. Per row (sample and channel) in one fused pass of torch's
    BatchNorm backward kernel (its bias and weight gradients for mean 0 and inverse standard
    deviation 1), then over each group's samples in float64; other dtypes sum in float32.
    """
    groups, size, channels, _ = centred.shape
    if centred.dtype in NATIVE_DTYPES:
        rows = groups * size * channels
        zeros, ones = unit_rows(rows, centred.dtype, centred.device)
        _, dot, total = torch.ops.aten.native_batch_norm_backward(
            values.view(1, rows, -1),
            centred.view(1, rows, -1),
            ones,  # not None: CUDA's kernel reads the weight's device (see HeteroBatchNorm)
            None,
            None,
            zeros,
            ones,
            True,
            0.0,
            [False, True, True],
        )
        per_row = torch.stack((total, dot))
    else:
        acc = accumulator_dtype(centred)
        total = values.sum(-1, dtype=acc)
        per_row = torch.stack((total, (values.to(acc) * centred.to(acc)).sum(-1)))
    return per_row.view(2, groups, size, channels).sum(2, dtype=torch.float64)


def affine_rows(
    centred: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, shape: torch.Size
) -> torch.Tensor:
    """``centred * scale + offset`` with ``scale`` and ``offset`` per group and channel
    (``[groups, C]``, float64), in ``centred``'s dtype: a new tensor of those values, of
    ``shape`` (not a view: the caller's in-place ops, such as ``ReLU(inplace=True)``, then
    need no copy of it in backward).

    One vectorised pass: torch's BatchNorm inference kernel with one channel per row (mean 0,
    variance 1, eps 0: exactly ``x * weight + bias``); ``addcmul`` for other dtypes.
    """
    groups, size, channels, _ = centred.shape
    dtype = centred.dtype
    both = torch.stack((scale, offset)).to(dtype)
    output = centred.new_empty(shape)
    if dtype not in NATIVE_DTYPES:
        weight, bias = both.view(2, groups, 1, channels, 1).unbind()
        torch.addcmul(bias, centred, weight, out=output.view(centred.shape))
        return output
    rows = groups * size * channels
    weight, bias = both.unsqueeze(2).expand(2, groups, size, channels).reshape(2, rows).unbind()
    zeros, ones = unit_rows(rows, dtype, centred.device)
    torch.ops.aten.native_batch_norm.out(
        centred.view(1, rows, -1),
        weight,
        bias,
        zeros,
        ones,
        False,
        0.0,
        0.0,
        out=output.view(1, rows, -1),
        save_mean=centred.new_empty(0),
        save_invstd=centred.new_empty(0),
    )
    return output
