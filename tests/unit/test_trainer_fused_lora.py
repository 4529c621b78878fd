"""The fused 4-bit LoRA layer computes what PEFT computes (bitsandbytes quantises on the CPU too)."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model
from torch import nn
from torch.utils.checkpoint import checkpoint

from workers.trainer import fused_lora
from workers.trainer.fused_lora import fuse_lora_4bit


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = _nf4(nn.Linear(96, 64, bias=False))
        self.o_proj = _nf4(nn.Linear(64, 96, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # non-reentrant checkpointing, as the trainer runs it: the fused node is recomputed
        out: torch.Tensor = checkpoint(
            lambda h: self.o_proj(torch.relu(self.q_proj(h))), x, use_reentrant=False
        )
        return out


def _nf4(lin: nn.Linear) -> nn.Module:
    import bitsandbytes as bnb

    q = bnb.nn.Linear4bit(
        lin.in_features,
        lin.out_features,
        bias=False,
        compute_dtype=torch.float32,
        quant_type="nf4",
        compress_statistics=True,
    )
    q.weight = bnb.nn.Params4bit(
        lin.weight.data.clone(), requires_grad=False, quant_type="nf4", compress_statistics=True
    )
    return q.to("cpu")  # quantises


def _grads(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    model.zero_grad()
    x.grad = None
    y = model(x)
    y.square().sum().backward()
    assert x.grad is not None
    lora = [p.grad for _, p in sorted(model.named_parameters()) if p.requires_grad]
    return (y.detach(), x.grad.clone(), *(g.clone() for g in lora if g is not None))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_fused_layer_matches_peft_and_unloads(monkeypatch: object) -> None:
    torch.manual_seed(0)
    cfg = LoraConfig(
        r=4,
        lora_alpha=12,  # scale 3: not a power of two, so a misplaced scale shows
        lora_dropout=0.0,
        target_modules=["q_proj", "o_proj"],
        init_lora_weights=False,  # B != 0, so every gradient term is non-zero
    )
    model = get_peft_model(_Block(), cfg)
    x = torch.randn(3, 5, 96, requires_grad=True)
    want = _grads(model, x)

    calls = []
    apply = fused_lora._Lora4bit.apply

    def counted(*a: object) -> torch.Tensor:
        calls.append(1)
        out: torch.Tensor = apply(*a)
        return out

    assert fuse_lora_4bit(model) == 2
    fused_lora._Lora4bit.apply = counted  # type: ignore[method-assign]
    try:
        got = _grads(model, x)
    finally:
        fused_lora._Lora4bit.apply = apply  # type: ignore[method-assign]
    assert len(calls) == 4  # two layers, forward and recompute
    assert len(got) == len(want) == 6
    for g, w in zip(got, want, strict=True):
        assert _rel(g, w) < 1e-5

    # With the adapter disabled (DPO's reference pass) the layers fall back to the base alone.
    with model.disable_adapter():
        assert _rel(model(x), want[0]) > 0.01
    base = model.unload()
    assert type(base.q_proj).__name__ == "Linear4bit" and "forward" not in vars(base.q_proj)


def test_layers_with_dropout_keep_peft_forward() -> None:
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "o_proj"])
    assert fuse_lora_4bit(get_peft_model(_Block(), cfg)) == 0
