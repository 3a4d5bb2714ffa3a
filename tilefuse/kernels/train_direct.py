"""The training convs that do not take train_conv.py's GEMM paths, and which kernels run them instead: one
classification for the schedule (training/schedule.py) and the fused patterns (training/patterns.py, which leave
these convs out: they have no input stage or epilogue to fuse into).

    depthwise      groups = C = O                          train_depthwise.py: a channel's planes directly
    small groups   at most MAX_GROUP channels a group      train_grouped.py: a group's phase planes directly
    fc             1x1 on 1x1 maps, stride 1, no padding,  a linear layer on (N, C) rows (dense.py): the
                   one group (squeeze-excitation FCs)      squeeze-excitation FCs of RegNet, EfficientNet and
                                                           MobileNetV3; train_conv's task grid cost them 0.3 ms
                                                           forward and 1 ms backward a call (RegNetY, batch 32)
"""
from __future__ import annotations

import numpy as np

from .dense import linear_backward, linear_forward
from .train_depthwise import depthwise_backward_cnhw, depthwise_forward_cnhw, is_depthwise
from .train_grouped import grouped_backward_cnhw, grouped_forward_cnhw, is_small_grouped


def is_fc(x_shape, w_shape, stride, padding, groups) -> bool:
    """A 1x1 conv on 1x1 maps, stride 1, no padding, one group: a linear layer over the images."""
    return (groups == 1 and tuple(w_shape[2:]) == (1, 1) and tuple(x_shape[2:]) == (1, 1)
            and tuple(stride) == (1, 1) and not any(padding))


def fc_forward_cnhw(x, w, g, bias=None):
    """y (O, N, 1, 1) = the linear layer of x (C, N, 1, 1) with w (O, C, 1, 1) [+ bias]."""
    y = linear_forward(x.reshape(g.C, g.N).T, w.reshape(g.O, g.C), bias)        # (N, O)
    return np.ascontiguousarray(y.T).reshape(g.O, g.N, 1, 1)


def fc_backward_cnhw(dy, x, w, g, need_dx=True, has_bias=False):
    """(dw, db, dx) of y = fc_forward_cnhw(x, w, g): dw like w, db (O,) or None, dx (C, N, 1, 1) or None."""
    dx, dw, db = linear_backward(dy.reshape(g.O, g.N).T, x.reshape(g.C, g.N).T, w.reshape(g.O, g.C), has_bias)
    dx = np.ascontiguousarray(dx.T).reshape(g.C, g.N, 1, 1) if need_dx else None   # (N, C) -> CNHW
    return dw.reshape(w.shape).astype(w.dtype), (db.astype(x.dtype) if has_bias else None), dx


def direct_conv(x_shape, w_shape, params):
    """(forward, backward) for a conv2d op (IR params) that one of the kernels above runs, else None (train_conv's
    GEMM paths). forward(x, w, g, bias) -> y; backward(dy, x, w, g, need_dx, has_bias) -> (dw, db, dx); CNHW."""
    groups = params["groups"]
    if is_depthwise(x_shape, w_shape, groups):
        return depthwise_forward_cnhw, depthwise_backward_cnhw
    if is_small_grouped(x_shape, w_shape, groups):
        return grouped_forward_cnhw, grouped_backward_cnhw
    if is_fc(x_shape, w_shape, params["stride"], params["padding"], groups):
        return fc_forward_cnhw, fc_backward_cnhw
    return None
