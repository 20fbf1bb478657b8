"""Putting batches on the training loop's device: where HF Accelerate wants them, and copies
made ahead in a background thread (on CUDA: from pinned memory, on a side stream, with the
event the loop's stream waits on before it uses the batch)."""

from __future__ import annotations

import sys
from typing import Any

import torch


def accelerate_device() -> torch.device | None:
    """The device HF Accelerate places batches on, when an Accelerator is set up in this process."""
    state = sys.modules.get("accelerate.state")
    if state is None or not state.PartialState._shared_state:
        return None
    device = state.PartialState().device
    return None if device.type == "cpu" else device


def to_device(value: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, dict):
        return {key: to_device(v, device, non_blocking) for key, v in value.items()}
    return value


def copied_ahead(item: Any, device: torch.device, stream: Any) -> tuple[Any, Any]:
    """``item`` on ``device``, copied from a background thread, and the CUDA event that marks
    the copy done (None off CUDA). ``stream``: the side stream CUDA copies are made on."""
    if device.type != "cuda":
        return to_device(item, device, False), None
    with torch.cuda.stream(stream):
        item = to_device(_pinned(item), device, True)
        event = torch.cuda.Event()
        event.record(stream)
    return item, event


def arrived(item: Any, copied: Any, device: torch.device | None) -> Any:
    """A batch copied ahead, made safe to use on the training loop's CUDA stream."""
    if copied is not None:
        stream = torch.cuda.current_stream(device)
        stream.wait_event(copied)
        _record_stream(item, stream)  # the allocator must not reuse its memory before the loop is done
    return item


def _pinned(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value if value.is_pinned() else value.pin_memory()
    if isinstance(value, dict):
        return {key: _pinned(v) for key, v in value.items()}
    return value


def _record_stream(value: Any, stream: Any) -> None:
    if isinstance(value, torch.Tensor):
        value.record_stream(stream)
    elif isinstance(value, dict):
        for v in value.values():
            _record_stream(v, stream)
