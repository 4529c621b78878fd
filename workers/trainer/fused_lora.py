"""One autograd function per adapted 4-bit layer: NF4 base matmul and LoRA in a single node.

PEFT runs a LoRA layer on a bitsandbytes Linear4bit as separate modules (the 4-bit matmul, a
defensive clone of its output, dropout, lora_A, lora_B, the scaling and the sum), each with its
own kernels and autograd node, forward, recompute and backward. At 1B parameters a QLoRA step is
bound by that per-op overhead rather than by FLOPs (BENCHMARKS.md "QLoRA against Unsloth"), so a
layer without dropout (cft's default) is computed here as `x W^T + s (x A^T) B^T`, dequantising
W once per forward and once per backward, as Unsloth's fast LoRA path does. Layers that are not
in that plain form (dropout, DoRA, several or disabled adapters, merged weights, a bias) keep
PEFT's forward; so does any call made with the adapter disabled (TRL's DPO reference pass).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn


class _Lora4bit(torch.autograd.Function):
    """y = x W^T + s (x A^T) B^T with W in NF4: saves x and x A^T, never the dequantised W."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        weight: Any,
        quant_state: Any,
        scale: float,
    ) -> torch.Tensor:
        from bitsandbytes.functional import dequantize_4bit

        x2 = x.reshape(-1, x.shape[-1])
        w = dequantize_4bit(weight, quant_state).to(x.dtype)
        xa = torch.mm(x2, lora_a.to(x.dtype).t())
        out = torch.mm(x2, w.t())
        out.addmm_(xa, lora_b.to(x.dtype).t(), alpha=scale)
        ctx.save_for_backward(x2, xa, lora_a, lora_b)
        ctx.weight, ctx.quant_state, ctx.scale = weight, quant_state, scale
        return out.view(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        from bitsandbytes.functional import dequantize_4bit

        x2, xa, lora_a, lora_b = ctx.saved_tensors
        scale = ctx.scale
        g = grad.reshape(-1, grad.shape[-1]).to(x2.dtype)
        gb = torch.mm(g, lora_b.to(g.dtype))  # dL/d(xa) / scale
        grad_a = torch.mm(gb.t(), x2).mul_(scale).to(lora_a.dtype)
        grad_b = torch.mm(g.t(), xa).mul_(scale).to(lora_b.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            w = dequantize_4bit(ctx.weight, ctx.quant_state).to(g.dtype)
            dx = torch.mm(g, w)
            dx.addmm_(gb, lora_a.to(g.dtype), alpha=scale)
            grad_x = dx.view(*grad.shape[:-1], dx.shape[-1])
        return grad_x, grad_a, grad_b, None, None, None


def _plain_adapter(layer: Any) -> str | None:
    """The single active adapter of a plain LoRA layer (no dropout, DoRA, bias), else None."""
    active = list(layer.active_adapters)
    if len(active) != 1 or layer.disable_adapters or layer.merged:
        return None
    name = active[0]
    if name not in layer.lora_A or not isinstance(layer.lora_dropout[name], nn.Identity):
        return None
    if layer.use_dora.get(name) or getattr(layer, "lora_bias", {}).get(name):
        return None
    if getattr(layer.get_base_layer(), "bias", None) is not None:
        return None
    return str(name)


def _fused_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    name = None if args or kwargs else _plain_adapter(self)
    if name is None:
        return type(self).forward(self, x, *args, **kwargs)  # type: ignore[no-any-return]
    base = self.get_base_layer()
    dtype = x.dtype
    compute = getattr(base, "compute_dtype", None) or dtype
    out = _Lora4bit.apply(
        x.to(compute),
        self.lora_A[name].weight,
        self.lora_B[name].weight,
        base.weight,
        base.weight.quant_state,
        float(self.scaling[name]),
    )
    return out.to(dtype)  # type: ignore[no-any-return]


def fuse_lora_4bit(model: Any) -> int:
    """Give every plain LoRA layer on a 4-bit base the fused forward; returns how many.

    The forward is set on the PEFT layer instances, which PEFT's unload discards with them, so
    the shared base keeps nothing of it.
    """
    from bitsandbytes.nn.modules import Linear4bit
    from peft.tuners.lora import LoraLayer

    n = 0
    for module in model.modules():
        # PEFT wraps a Linear4bit in its bnb LoRA class on CUDA and in its plain one on a CPU
        if (
            isinstance(module, LoraLayer)
            and isinstance(module.get_base_layer(), Linear4bit)
            and _plain_adapter(module) is not None
        ):
            setattr(module, "forward", types.MethodType(_fused_forward, module))  # noqa: B010
            n += 1
    return n
