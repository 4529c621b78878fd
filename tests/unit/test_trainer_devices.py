"""`--devices` specs, the supervisor's restarts and exits, the strategy rule, rank failure text."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from app.training.methods import Hyperparameters
from tests.support.training import tiny_llama
from workers.trainer.devices import DeviceGroup, DeviceSpecError, parse_devices
from workers.trainer.launch import choose_strategy, failure_summary, launch_command
from workers.trainer.supervisor import Supervisor, describe_exit


def test_device_specs() -> None:
    assert parse_devices("all", 2) == [DeviceGroup("cuda", ("0",)), DeviceGroup("cuda", ("1",))]
    assert parse_devices("0+1,2", 4) == [
        DeviceGroup("cuda", ("0", "1")),
        DeviceGroup("cuda", ("2",)),
    ]
    assert parse_devices("cpu:3", 0) == [DeviceGroup("cpu", ("cpu",))] * 3
    assert [g.label for g in parse_devices("cpu,cpu+cpu", 0)] == ["cpu", "cpu+cpu"]
    # Pinning maps indices through the parent's own CUDA_VISIBLE_DEVICES.
    assert parse_devices("1", 2)[0].env("4,6") == {"CUDA_VISIBLE_DEVICES": "6"}
    assert parse_devices("0+1", 2)[0].env(None) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert parse_devices("cpu", 0)[0].env("0") == {"CUDA_VISIBLE_DEVICES": ""}
    for spec, needle in [
        ("all", "no CUDA device is visible on this host; use --devices cpu"),
        ("2", "GPU 2 is not visible (2 visible: 0..1)"),
        ("0,0+1", "a GPU belongs to two workers"),
        ("0+0", "a GPU is named twice"),
        ("cpu:0", "cpu:N needs N between 1 and 64"),
        ("gpu0", "a group is GPU indices joined by +"),
        ("0,,1", "empty entry"),
    ]:
        with pytest.raises(DeviceSpecError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            parse_devices(spec, 0 if spec == "all" else 2)


def test_supervisor_restarts_a_dying_worker_then_gives_up(caplog) -> None:  # type: ignore[no-untyped-def]
    """A real child that exits 2 at once (a bad option) is restarted, then the parent exits 1."""
    caplog.set_level(logging.INFO)
    sup = Supervisor(
        [DeviceGroup("cpu", ("cpu",))], ["--lease", "soon"], max_restarts=1, backoff_s=0.05
    )
    assert sup.run() == 1
    text = caplog.text
    assert "trainer for devices cpu" in text
    assert "died: exit code 2; restarting it (1 of 1 restarts" in text
    assert "died 2 times in 600 s (more than --max-restarts 1): stopping every trainer" in text
    assert describe_exit(-9) == "killed by SIGKILL"


def test_supervisor_exits_0_when_every_worker_finished() -> None:
    sup = Supervisor([DeviceGroup("cpu", ("cpu",))] * 2, ["--help"], backoff_s=0.05)
    assert sup.run() == 0


def test_strategy_rule(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    with (base / "model.safetensors").open("wb") as f:
        f.truncate(16 * 2**30)  # 8B parameters in bf16: 4.2 GiB in NF4
    pick = {"kind": "cuda", "base_model": str(base), "models_dir": tmp_path}
    assert choose_strategy(Hyperparameters(), gpu_memory_gb=79.2, **pick) == "ddp"
    assert choose_strategy(Hyperparameters(), gpu_memory_gb=8.0, **pick) == "fsdp"
    assert (
        choose_strategy(Hyperparameters(distributed_strategy="fsdp"), gpu_memory_gb=79.2, **pick)
        == "fsdp"
    )
    cpu = pick | {"kind": "cpu"}
    assert choose_strategy(Hyperparameters(), gpu_memory_gb=None, **cpu) == "ddp"
    with pytest.raises(ValueError, match="fsdp needs GPUs"):
        choose_strategy(Hyperparameters(distributed_strategy="fsdp"), gpu_memory_gb=None, **cpu)
    cmd = launch_command(2, "fsdp", "cuda", tmp_path / "spec.json")
    assert "--use_fsdp" in cmd and cmd[cmd.index("--num_processes") + 1] == "2"
    assert "--multi_gpu" in launch_command(2, "ddp", "cpu", tmp_path / "spec.json")


def test_failure_summary_names_the_first_failed_rank() -> None:
    log = """[rank1]: Traceback (most recent call last):
[rank1]:   File "x.py", line 3, in <module>
[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 11)
  traceback : Signal 15 (SIGTERM) received by PID 11
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 12)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
"""
    assert failure_summary(log) == (
        "rank 1 exited with code 1; last error: [rank1]: torch.OutOfMemoryError:"
        " CUDA out of memory. Tried to allocate 2.00 GiB"
    )


def test_training_attention_turns_cudnn_sdpa_off_for_packed_cuda_runs_only() -> None:
    import torch

    from workers.trainer.trl_factory import training_attention

    assert torch.backends.cuda.cudnn_sdp_enabled()
    with training_attention(packed_on_cuda=True):
        # the host-bound QLoRA step's costliest kernel choice is off; the others stay on
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored for whatever runs next
    with training_attention(packed_on_cuda=False):
        assert torch.backends.cuda.cudnn_sdp_enabled()
    with pytest.raises(RuntimeError), training_attention(packed_on_cuda=True):
        raise RuntimeError("a failed run")
    assert torch.backends.cuda.cudnn_sdp_enabled()


def _tiny_llama():  # type: ignore[no-untyped-def]
    model = tiny_llama(hidden=64, layers=2, heads=4, kv_heads=4)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def test_compiled_layers_train_like_eager_layers_and_are_restored() -> None:
    """The compiled decoder layers give eager's loss and gradients (packed rows of two lengths,
    checkpointed as in training), and the shared base's layers are eager again afterwards."""
    import torch

    from workers.trainer.trl_factory import compiled_layers

    model = _tiny_llama()
    layers = list(model.model.layers)

    def step(length: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        ids = torch.arange(length).remainder(97).unsqueeze(0)
        # two packed documents (position ids restart), as padding-free SFT batches them
        pos = torch.cat([torch.arange(length // 2), torch.arange(length - length // 2)])
        out = model(input_ids=ids, labels=ids, position_ids=pos.unsqueeze(0))
        out.loss.backward()
        return out.loss.detach(), [p.grad.clone() for p in model.parameters()]

    eager = [step(n) for n in (24, 37)]
    with compiled_layers(model, enabled=True):
        assert all(layer._compiled_call_impl is not None for layer in layers)
        assert torch._dynamo.config.suppress_errors  # a graph that fails to build runs eager
        compiled = [step(n) for n in (24, 37)]  # packed rows change length every batch
    assert all(layer._compiled_call_impl is None for layer in layers)
    assert not torch._dynamo.config.suppress_errors  # PyTorch's default again
    for (loss_e, grads_e), (loss_c, grads_c) in zip(eager, compiled, strict=True):
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-4, atol=1e-5)
        for g_c, g_e in zip(grads_c, grads_e, strict=True):
            torch.testing.assert_close(g_c, g_e, rtol=1e-3, atol=1e-5)

    with compiled_layers(model, enabled=False):
        assert all(layer._compiled_call_impl is None for layer in layers)
    with pytest.raises(RuntimeError), compiled_layers(model, enabled=True):
        raise RuntimeError("a failed run")
    assert all(layer._compiled_call_impl is None for layer in layers)


def test_offloading_keeps_the_allocator_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's offloading context empties the CUDA cache on each micro-batch of a QLoRA run; cft's
    trainers keep the cache (free blocks the next micro-batch reuses) and TRL's state reset."""
    import sys
    import types

    import torch
    from torch.autograd.graph import saved_tensors_hooks
    from trl.models.activation_offloading import OffloadActivations

    from workers.trainer.trl_factory import keep_allocator_cache

    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setitem(sys.modules, "bitsandbytes", sys.modules.get("bitsandbytes", types))

    def offload_ctx() -> OffloadActivations:
        # OffloadActivations() needs an accelerator: build one as its __init__ would, no streams
        ctx = OffloadActivations.__new__(OffloadActivations)
        saved_tensors_hooks.__init__(ctx, lambda t: t, lambda t: t)
        ctx.use_streams = False
        ctx.device_module = torch.cuda
        ctx.tracker, ctx.storage_to_tensor_id, ctx._storage_key_by_tensor_id = {1: 0}, {}, {}
        return ctx

    plain = types.SimpleNamespace(maybe_activation_offload_context=offload_ctx())
    with plain.maybe_activation_offload_context:
        pass
    # TRL's own behaviour: if this fails, TRL changed and the patch is moot
    assert emptied == [True]

    emptied.clear()
    kept = types.SimpleNamespace(maybe_activation_offload_context=offload_ctx())
    keep_allocator_cache(kept)
    keep_allocator_cache(kept)  # idempotent
    ctx = kept.maybe_activation_offload_context
    with ctx:
        assert ctx.tracker == {}  # the stale state is still cleared
        assert ctx.device_module.Stream is torch.cuda.Stream  # the rest is torch.cuda's
    assert emptied == []
    keep_allocator_cache(types.SimpleNamespace(maybe_activation_offload_context=None))  # no-op
