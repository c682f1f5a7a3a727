"""What a device's weights figure is on any CPU (native/backends.py): llama.cpp places some
weights in a device's extra buffer type (``CPU_REPACK``, ``AMX``) when its backend computes on
them there, in a layout of its own that can be larger than the file's tensors, so a device's
weights are the model's size only when none of its extra buffer types holds any."""

from __future__ import annotations

from skippyctl.native.backends import GgmlBackends


def weights_fit_the_model(weights_bytes: int, model_size_bytes: int, device: str) -> bool:
    """`weights_bytes` on `device` are the model's size, or more when the device has an extra
    buffer type (then some weights may be repacked there)."""
    if weights_bytes == model_size_bytes:
        return True
    extra = [b for b in GgmlBackends().buffer_types() if b.extra and b.device == device]
    return bool(extra) and weights_bytes > model_size_bytes
