"""restartbench's lazy engine under ``--emulate``: its own capture, file plan, host buffer, copies and flush."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from restartbench.config import RunConfig
from restartbench.emulator import Emulator, differences, random_tensor
from restartbench.engines import create_engine
from restartbench.engines.lazy.predict import lazy_capture
from restartbench.events import Event


class LazyFiles(Emulator):
    """restartbench's lazy engine, one ``LazyEngine`` per emulated rank (its host buffer kept from save to save, as
    a rank's is)."""

    how = ("restartbench's lazy engine: its capture of the rank's state (random data), its file plan, headers, host "
           "buffer, background copies and streamed, fsync'd flush (LazyEngine.save_captured); the next optimizer "
           "step's wait for the copies comes right after the save; restored with its own header checks and scatter "
           "reads (LazyEngine.load_into) into tensors allocated before the load, plain values compared")

    def __init__(self, ranks: Any):
        super().__init__(ranks)
        self.engines = {rank: create_engine(ranks.cfg.engine) for rank in ranks.ranks}
        for rank, engine in self.engines.items():
            engine.on_copy_wait = lambda tag, seconds, at, log=ranks.logs[rank]: log.emit(
                Event.CHECKPOINT_COPY_WAIT, tag=tag, step=int(tag.removeprefix("step")), duration_s=seconds,
                emulated=True, time=at)

    @staticmethod
    def refusal(cfg: RunConfig) -> str | None:
        if cfg.engine.dp_read_once:
            return ("--dp-read-once is not emulated (its broadcast needs every data-parallel replica in a process of "
                    "its own, reading at once); leave it out: each emulated rank then reads its module file itself")
        return None

    def _capture(self, rank: int, step: int) -> tuple[Any, Any]:
        coord, state = self.ranks.state(rank, step)
        return lazy_capture(self.ranks.setup(step), rank, coord, state)

    def _random(self, file: str, name: str, like: Any, step: int) -> Any:
        """Random data for a tensor of a file: the model file's tensors are the same for every replica that reads
        them."""
        return random_tensor(like.shape, like.dtype, self.ranks.cfg.train.seed, step, file, name)

    def stage(self, rank: int, step: int) -> Any:
        layout, captured = self._capture(rank, step)
        tensors = {spec.name: self._random(file, spec.name, captured.tensors[spec.name], step)
                   for file, _, specs in captured.groups for spec, _ in specs}
        return layout, replace(captured, tensors=tensors)

    def save(self, rank: int, staged: Any, tag: str) -> None:
        layout, captured = staged
        self.engines[rank].save_captured(captured, layout, self.ranks.ckpt_dir, tag)

    def next_step(self, rank: int, tag: str) -> None:
        """The optimizer step right after the save: it waits for the copies (recorded as checkpoint.copy_wait)."""
        self.engines[rank].wait_for_copies()

    def wait_until_durable(self, rank: int) -> float:
        return self.engines[rank].wait_until_durable()

    def written(self, rank: int) -> list[Any]:
        return self.engines[rank].written()

    def hold(self, rank: int, step: int) -> Any:
        """The rank's module tensors (by saved name) and optimizer tensors as a fresh process holds them, and the
        plain values the save recorded."""
        import torch

        layout, captured = self._capture(rank, step)
        _, state = self.ranks.state(rank, step)
        module = {f"module.{k}": torch.empty(t.shape, dtype=t.dtype) for k, t in state.module.state_dict().items()}
        optim = {spec.name: torch.empty(captured.tensors[spec.name].shape, dtype=captured.tensors[spec.name].dtype)
                 for _, kind, specs in captured.groups if kind == "optim" for spec, _ in specs}
        return layout, module, optim, json.loads(json.dumps(captured.values))

    def load(self, rank: int, tag: str, held: Any) -> tuple[list[Any], Any]:
        from restartbench.engines.lazy.format import LazyRestoreError

        layout, module, optim, _ = held
        seen: dict[str, Any] = {}

        def optim_targets(header: dict[str, Any]) -> dict[str, Any]:
            saved = sorted(t["name"] for t in header["tensors"])
            if saved != sorted(optim):
                raise LazyRestoreError(f"{layout.optim_file} holds tensors {saved[:5]}..., rank {rank} expects "
                                       f"{sorted(optim)[:5]}...: not this layout's checkpoint")
            seen["values"] = header["values"]
            return optim

        engine = self.engines[rank]
        engine.load_into(layout, self.ranks.ckpt_dir, tag, module, optim_targets)
        return engine.read(), seen["values"]

    def compare(self, rank: int, step: int, held: Any, restored: Any) -> list[str]:
        layout, module, optim, values = held
        problems = [f"{layout.optim_file}: the plain values differ after the restore"] if restored != values else []
        for file, tensors in ((layout.model_file, module), (layout.optim_file, optim)):
            for name, got in tensors.items():
                problems += differences({name: self._random(file, name, got, step)}, {name: got}, file)
        return problems
