"""The files of DeepSpeed's engines, predicted: torch (DeepSpeed's default engine), fastpersist and datastates.

- torch: the state dicts of ``restartbench.shards.shard_files``, each sized by torch.save itself;
- fastpersist: the same state dicts, written by the ranks DeepSpeed's ``DataParallelWriterFactory`` makes
  writers, into its FastFileWriter, and renamed as the harness renames them;
- datastates: the same state dicts, laid out as DataStates-LLM lays each out (``datastates_layout``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
from dataclasses import replace
from typing import Any

from restartbench.shards import ShardSetup, recovery_scripts, shard_files
from restartbench.sizes import EnginePredictor, PlannedFile, payload_bytes, saved_size, signature

SIZE_TOLERANCE_BYTES = 64
"""torch (DeepSpeed's default engine): largest difference between a predicted and a written file size, bytes, needed
on a GPU run only. On a CPU run every file is predicted byte for byte: the plan's torch.save'd pickle (the zip's
``data.pkl``) is the run's own, and tests/test_predict.py holds stored and fresh CPU runs to 0. Each file is
torch.save's zip, which starts every record on a 64-byte boundary, so a pickle a few bytes longer moves the file by 0
or 64 B. On a GPU, DeepSpeed's optimizer file holds the fp32 partition and Adam's moments on the device, and torch.save
pickles each storage's location, ``cuda:<index>`` instead of ``cpu``; the plan saves CPU tensors, so such a file can
be 64 B longer than predicted (small tp1pp1dp2 bf16's is, with ``cuda:0``; tiny's are not). Layer files are
cloned to the CPU before they are saved and model files hold no tensor: exact on any device. Checked on the first H100
visit (tests/data/gpu_runs): at 1B and at small, every file exact but the optimizer file, 64 B over.

Every engine's tolerance assumes the run's optimizer applied every step. DeepSpeed skips a step whose gradient norm is
not finite (always checked in fp32, in bf16 only with ``check_grad_overflow``), and then its ``skipped_steps`` and the
lr scheduler's iteration differ from the plan's: a pickled integer takes 1, 2 or 4 bytes below 256, 65,536 and 2**31,
so a torch.save'd file can move by 64 B; the lazy header and TorchSnapshot's manifest hold these values as text."""
FASTPERSIST_TOLERANCE_BYTES = SIZE_TOLERANCE_BYTES
"""fastpersist: the same torch.save zips as torch (written into DeepSpeed's FastFileWriter, which adds no padding:
its aligned O_DIRECT writes end with a buffered write of the unaligned tail), so the same tolerance: exact on a CPU
run, 64 B for the optimizer files' device locations on a GPU run."""


def deepspeed_files(setup: ShardSetup, scratch: str, stream: bool = False,
                     model_writers: set[int] | None = None) -> list[PlannedFile]:
    """DeepSpeed's files (``shard_files``), each sized by torch.save itself; ``stream``: saved into a file object
    (as FastPersist's writer is), not to a path (torch names the zip's root folder after a path's file name)."""
    sizes: dict[tuple, int] = {}  # files alike but for their names' digits are serialized once
    files = []
    for f in shard_files(setup, model_writers):
        key = (0 if stream else len(os.path.basename(f.path)), signature(f.state))
        if key not in sizes:
            sizes[key] = saved_size(f.state, f.path, scratch, stream)
        files.append(PlannedFile(f.path, f.rank, f.kind, payload_bytes(f.state), sizes[key]))
    return files


def fastpersist_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    """DeepSpeed's FastPersist writer: the state dicts of DeepSpeed's default engine, torch.save'd into DeepSpeed's
    FastFileWriter (a file object, so the zip's root folder is named ``archive``, not after the file; it adds no
    padding). Only ranks with a data-parallel writer (``fastpersist_writers``) write, and each of them writes the
    model file too; FastPersist suffixes every file ``-<writer>.<writers>``, and the harness then gives each file
    DeepSpeed's name back, except the copies of a name a lower writer holds (``restore_deepspeed_name``): those keep
    their suffix."""
    writers = fastpersist_writers(setup)
    files = [f for f in deepspeed_files(setup, scratch, stream=True, model_writers=set(writers))
             if f.rank in writers]
    named: set[str] = set()
    for i in sorted(range(len(files)), key=lambda i: writers[files[i].rank][0]):  # the lowest writer keeps the name
        if files[i].path in named:
            index, count = writers[files[i].rank]
            files[i] = replace(files[i], path=f"{files[i].path}-{index}.{count}")
        named.add(files[i].path)
    return files


def fastpersist_writers(setup: ShardSetup) -> dict[int, tuple[int, int]]:
    """Rank -> (writer index, writers) for the ranks FastPersist gives a writer: DeepSpeed's own
    DataParallelWriterFactory on each rank's parallel info (``create_data_parallel_writer_config`` without
    processes), with the run's writer block, and each rank's machine as launch.sh exports it (``CROSS_RANK``: the
    rank's node, ``CROSS_SIZE``: the nodes)."""
    from deepspeed.runtime.model_checkpointing.config import get_checkpoint_writer_config
    from deepspeed.runtime.model_checkpointing.constants import CHECKPOINT_DATA_PARALLEL, CHECKPOINT_IO_MULTIPLIER
    from deepspeed.runtime.model_checkpointing.data_parallel_writer_factory import DataParallelWriterFactory
    from deepspeed.runtime.model_checkpointing.utils import SOCKETS_PER_MACHINE, MPUInfo, UniversalParallelInfo
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    from deepspeed.runtime.zero.config import ZeroStageEnum

    layout, machines = setup.layout, setup.nnodes
    per_machine = layout.world_size // machines
    config = get_checkpoint_writer_config(setup.ds_config["checkpoint"])
    topology = PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)
    writers = {}
    for rank in range(layout.world_size):
        coord = topology.get_coord(rank)
        mpu = MPUInfo(pp_world_size=layout.pp, pp_rank=coord.pipe, tp_world_size=layout.tp, tp_rank=coord.model,
                      dp_world_size=layout.dp, dp_rank=coord.data,
                      dp_peer_ranks=topology.filter_match(pipe=coord.pipe, model=coord.model))
        info = UniversalParallelInfo(global_world_size=layout.world_size, global_rank=rank,
                                     local_rank=rank % per_machine, mpu_info=mpu, ep_info=None,
                                     pure_dp=layout.dp == layout.world_size,
                                     num_machines=machines, machine_rank=rank // per_machine,
                                     num_sockets=machines * SOCKETS_PER_MACHINE)
        with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed prints each rank's assignment
            writer = DataParallelWriterFactory(info, config[CHECKPOINT_DATA_PARALLEL]).create_config(
                ZeroStageEnum.optimizer_states, has_moe_layers=False)
        if writer is not None:
            writers[rank] = (writer.rank, writer.world_size * config[CHECKPOINT_IO_MULTIPLIER])
    return writers


DATASTATES_TOLERANCE_BYTES = 0
"""datastates: a file's size follows from its state dict alone (no zip, no alignment, no device in it), so the
prediction is exact; ``datastates_layout`` is held byte for byte to DataStates-LLM's own ``save_background`` run on
the plan's states (tests/test_predict.py). No real run of it has shown its files yet (CUDA only)."""
DATASTATES_KEY_SEPARATOR = "|"
DATASTATES_HEADER_LENGTH_BYTES = 8


def datastates_files(setup: ShardSetup, scratch: str) -> list[PlannedFile]:
    """DeepSpeed's files under its DataStates engine: the state dicts of its default engine (DeepSpeed hands
    ``checkpoint_engine.save`` the same dicts, uncloned: ``preserves_storage_sharing`` is False), each laid out by
    ``datastates_layout``. Every rank with a file writes it, as with torch."""
    del scratch  # nothing is written: the layout is arithmetic and one pickle
    layouts: dict[tuple, tuple[int, int]] = {}
    files = []
    for f in shard_files(setup):
        key = signature(f.state)
        if key not in layouts:
            layouts[key] = datastates_layout(f.state, f.path)
        payload, size = layouts[key]
        files.append(PlannedFile(f.path, f.rank, f.kind, payload, size))
    return files


def datastates_layout(state: Any, path: str = "<state>") -> tuple[int, int]:
    """(tensor bytes, file bytes) of ``state`` as DataStates-LLM's ``Checkpointing.save_background`` writes it
    (third_party/datastates-llm/datastates/llm/checkpointing.py lines 39-98): dicts and lists are walked, each tensor
    replaced by the string ``TENSOR|<key>`` and its bytes (numel x element size: a view's own, not its storage's)
    placed one after the other; the file is an 8-byte header length, the header (JSON: each tensor's dtype, shape and
    offsets, then the offsets of the pickled rest), the tensors, then the rest pickled with the highest protocol.
    Refuses what DataStates refuses: a zero-size tensor (datastates/ckpt/ckpt_engine.py line 26 asserts, and the save
    job exits), or a tensor it would not walk to (in a tuple: pickled whole)."""
    import torch

    header: dict[str, Any] = {}
    offset = 0

    def walk(key: str, data: Any) -> Any:
        nonlocal offset
        if torch.is_tensor(data):
            size = data.numel() * data.element_size()
            if size == 0:
                raise ValueError(f"{path}: tensor {key!r} has no element: DataStates-LLM refuses it (its CkptEngine "
                                 "asserts 'Tensor size should be > 0' and the save job exits)")
            header[key] = {"dtype": str(data.dtype), "shape": tuple(data.shape),
                           "data_offsets": [offset, offset + size]}
            offset += size
            return f"TENSOR{DATASTATES_KEY_SEPARATOR}{key}"
        if isinstance(data, list):
            return [walk(_child(key, index), item) for index, item in enumerate(data)]
        if isinstance(data, dict):
            return {k: walk(_child(key, k), v) for k, v in data.items()}
        if isinstance(data, tuple) and any(torch.is_tensor(item) for item in data):
            raise ValueError(f"{path}: a tuple at {key!r} holds a tensor, which DataStates-LLM would pickle whole")
        return data

    rest = pickle.dumps(walk("", state), protocol=pickle.HIGHEST_PROTOCOL)
    header["datastates_metadata"] = {"data_offsets": [offset, offset + len(rest)]}
    return offset, DATASTATES_HEADER_LENGTH_BYTES + len(json.dumps(header).encode("utf-8")) + offset + len(rest)


def _child(key: str, name: Any) -> str:
    return f"{key}{DATASTATES_KEY_SEPARATOR}{name}" if key else f"{name}"


TORCH = EnginePredictor(deepspeed_files, SIZE_TOLERANCE_BYTES, recovery_scripts)
FASTPERSIST = EnginePredictor(fastpersist_files, FASTPERSIST_TOLERANCE_BYTES, recovery_scripts)
DATASTATES = EnginePredictor(datastates_files, DATASTATES_TOLERANCE_BYTES, recovery_scripts,
                             held_to="DataStates-LLM's own save_background run on the plan's states; no real run of "
                                     "it yet, CUDA only")
