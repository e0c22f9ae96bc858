"""DeepSpeed's Universal Checkpointing, as shipped, for a restart on another parallel layout (``--restore-layout``).

DeepSpeed's ``ds_to_universal.py`` converts a checkpoint offline into every parameter's fp32 weights and Adam moments
at full shape, by name (the study's model declares how its parameters are split: ``model.universal_checkpoint_info``);
a job on any layout then loads it with ``"checkpoint": {"load_universal": true}``. The conversion is one process over
the whole checkpoint (one worker each for extracting and merging, as the tests run it); the study times it as a
restart part of its own and records what it read and wrote. Its output, ``<tag>_universal`` beside the checkpoint,
has no manifest: it is never a committed checkpoint, and each attempt converts anew.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from restartbench.engines.base import Conversion
from restartbench.errors import StudyError

SUFFIX = "_universal"


class ConversionError(StudyError):
    pass


def _files(folder: Path, pattern: str = "*") -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob(pattern) if p.is_file()}


class UniversalConversion:
    """``Converter`` of DeepSpeed's default engine (``EngineInfo.converter``)."""

    ds_config = {"checkpoint": {"load_universal": True}}

    def convert(self, load_dir: str, tag: str) -> Conversion:
        import deepspeed.checkpoint

        source, output = Path(load_dir) / tag, Path(load_dir) / f"{tag}{SUFFIX}"
        shutil.rmtree(output, ignore_errors=True)  # an earlier attempt's output: every attempt converts anew
        command = [sys.executable, str(Path(deepspeed.checkpoint.__file__).parent / "ds_to_universal.py"),
                   "--input_folder", str(source), "--output_folder", str(output),
                   "--num_extract_workers", "1", "--num_merge_workers", "1"]
        converted = subprocess.run(command, capture_output=True, text=True)
        if converted.returncode != 0:
            tail = (converted.stdout[-1500:] + converted.stderr[-1500:]).strip()
            raise ConversionError(f"DeepSpeed's ds_to_universal.py failed on {source} (exit {converted.returncode}):"
                                  f"\n{tail}")
        read, written = _files(source, "*.pt"), _files(output)  # DeepSpeed's files, not the harness's manifest
        return Conversion(tag=output.name, files_read=len(read), bytes_read=sum(read.values()),
                          files_written=len(written), bytes_written=sum(written.values()), command=command)


UNIVERSAL = UniversalConversion()
