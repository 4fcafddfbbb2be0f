"""MFU (model FLOPs utilisation), as logged per step and reported in the manifest:

    MFU = F_step / (t_step * P * W)
    F_step = sum over the step's micro-batches (all ranks) of
             encoder_flops_per_token(model, T_b, m_b) * n_b

n_b is the batch's non-pad token count (padding is waste, not work), T_b its padded
length (what the attention kernels run on), m_b the share of its tokens that are MLM
targets; encoder_flops_per_token (bertcore/model/bert.py) is 6 * weights + 12 * L * H * T plus
the gathered MLM head. t_step is rank 0's wall time for the step, W the number of workers,
P the declared peak FLOP/s of one device: `<section>.peak_flops_per_device`, or when unset
the dense tensor-core peak of a known GPU (PEAK_FLOPS: A100 312e12, H100/H200 989e12 for
bf16/fp16; 19.5e12 / 67e12 for fp32, which PyTorch runs without TF32 by default). A CPU
has no default, so MFU is null there unless the key is set.
"""

from __future__ import annotations

from bertcore.train.config import TrainingConfig

PEAK_FLOPS: dict[tuple[str, str], float] = {
    # (device name fragment, precision) -> dense peak FLOP/s of one device (NVIDIA datasheets)
    ("A100", "bf16"): 312e12,
    ("A100", "fp16"): 312e12,
    ("A100", "fp32"): 19.5e12,
    ("H100", "bf16"): 989e12,
    ("H100", "fp16"): 989e12,
    ("H100", "fp32"): 67e12,
    ("H200", "bf16"): 989e12,
    ("H200", "fp16"): 989e12,
    ("H200", "fp32"): 67e12,
}


def peak_flops(cfg: TrainingConfig, device_name: str | None) -> float | None:
    """Declared peak FLOP/s of one device: the config's, else the PEAK_FLOPS entry whose
    name fragment occurs in the device name, else None (MFU not reported)."""
    if cfg.peak_flops_per_device is not None:
        return cfg.peak_flops_per_device
    if not device_name:
        return None
    for (fragment, precision), value in PEAK_FLOPS.items():
        if fragment in device_name and precision == cfg.precision:
            return value
    return None
