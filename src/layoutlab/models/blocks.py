"""Pieces the architectures share: layer factories bound to a layout and policy, and remat."""

from __future__ import annotations

import functools

from flax import nnx

from layoutlab import nn
from layoutlab.layout import Layout
from layoutlab.precision import Policy

__all__ = ["Sequential", "conv_bn_act", "layer_factories", "run_block"]


def layer_factories(layout: Layout, policy: Policy, rngs: nnx.Rngs):
    """``conv`` and ``norm`` partials, the way blocks receive them (Flax ImageNet style)."""
    conv = functools.partial(nn.Conv, use_bias=False, layout=layout, policy=policy, rngs=rngs)
    norm = functools.partial(nn.BatchNorm, layout=layout, policy=policy)
    return conv, norm


def run_block(block: nnx.Module, x, remat: bool):
    """Call ``block`` on ``x``; with ``remat`` its activations are recomputed in backward."""
    if remat:
        return nnx.remat(lambda b, y: b(y))(block, x)
    return block(x)


class Sequential(nnx.Module):
    """A list of layers applied in order; indices line up with ``torch.nn.Sequential``."""

    def __init__(self, *layers):
        self.layers = nnx.List(layers)

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)


def conv_bn_act(conv, norm, cin, cout, kernel, *, stride=1, groups=1, act=nn.ReLU):
    """torchvision's ``Conv2dNormActivation``: conv (no bias), BN, activation."""
    return Sequential(
        conv(cin, cout, kernel, strides=stride, padding=(kernel - 1) // 2, groups=groups),
        norm(cout),
        act(),
    )
