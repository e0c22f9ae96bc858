"""DeepSpeed's ZeRO optimizer as the study reads it: the optimizer itself and its flat fp32 partitions.

Two readers share these: the harness's capture of a rank's state (``restartbench.engines.harness_state``) and the
consolidated digest (``restartbench.consolidated``). Attribute access only: no torch or DeepSpeed import here.
"""

from __future__ import annotations

from typing import Any

#: Where a ZeRO optimizer keeps its flat fp32 partitions: ZeRO stage 1/2 (``DeepSpeedZeroOptimizer``), then
#: ``BF16_Optimizer``.
FP32_PARTITIONS = ("single_partition_of_fp32_groups", "fp32_groups_flat_partition")


def zero_optimizer(ds_engine: Any) -> Any:
    """The DeepSpeed engine's ZeRO optimizer (the one that wraps a torch optimizer); refused otherwise."""
    zero = ds_engine.optimizer
    if zero is None or not hasattr(zero, "optimizer"):
        raise TypeError(f"restartbench reads DeepSpeed's ZeRO optimizers only (the study runs ZeRO stage 1); the "
                        f"DeepSpeed engine has {type(zero).__name__}")
    return zero


def fp32_partitions(zero: Any) -> list[Any]:
    """Each parameter group's flat fp32 partition on this rank."""
    for name in FP32_PARTITIONS:
        if hasattr(zero, name):
            return list(getattr(zero, name))
    raise TypeError(f"{type(zero).__name__} has no fp32 partitions restartbench knows of (expected DeepSpeed's ZeRO "
                    "stage 1/2 optimizer or BF16_Optimizer)")
