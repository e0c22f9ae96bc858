#!/usr/bin/env python3
"""The study's GPU work in blocks, planned to the seconds a visit of a lent GPU machine has left.

    python bench/gpu_session.py --budget S --out DIR [--only BLOCK ...] [--dry-run]
    python bench/gpu_session.py --import-results DIR          (here, on what a visit brought back)

On a visit, through the device tool (make the wheels here first: ``scripts/device-wheels.sh``; then read
``status()``'s ``budget_left_s`` = B; one command runs at most 600 s and the machine's start-up, 30 s on the first
H100 visit, comes out of B):

    run(command="bash bench/gpu-session.sh --budget S --out $OUT", carry=[".whl"], timeout_s=S + 30)
        with S = min(B - 60, 560)

With over 200 s left after it, make a second call at once (the machine goes back after 30 s idle) with ``--only``
the blocks the first did not reach and S = what is left - 30: its output folder is a new one, so the blocks it
needs (``setup``) run again.

then, here: ``python bench/gpu_session.py --import-results FILES_AT`` (FILES_AT: the reply's ``files_at``), which
writes ``bench/results/<date>-<machine>-gpu-<block>.{json,md}`` for every block the visit ran; commit them, and the
next visit skips those blocks and does the rest.

Blocks, in priority order, each with its expected seconds and the basis of the estimate (bench/gpu_blocks.py):
``setup``, ``probe``, ``datastates-build``, ``smoke``, ``engines-1B-<engine>`` (one per engine), ``tests``.
A block starts only if its expected seconds plus a safety margin fit in what is left; one that fails records its
error (message, exit code, the tail of its log) and the session goes on. A block is skipped when ``bench/results``
(or this output folder's ledger) already holds it for this machine (the GPU's name) and this code (``code_identity``),
unless a block run this visit needs it (``setup``, ``datastates-build``: a fresh machine needs them again). A block
held only at other code (the code changes between visits) is tried after every block never measured here, and a
block measured here before is planned with the seconds it took (``measured``, ``visit_order``).

What comes back (the tool returns at most 8 files of 16 MiB from $OUT): ``ledger.json``, every block's outcome and
result files, rewritten atomically after each block, and ``logs.tar.gz``, every block's log and the run folders
(checkpoints left out, long logs cut to their last MiB), rewritten after each block too.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpu_blocks import Block, MiB, Where, block_env, plan_blocks
from gpu_results import (
    DONE,
    LEDGER,
    LOGS_TAR,
    ResultsError,
    held_result,
    held_results,
    import_results,
)
from results_io import ROOT, machine_name

sys.path.insert(0, str(ROOT))

from restartbench.storage import LocalStore  # noqa: E402

CODE_PATHS = ("restartbench", "bench", "templates", "third_party/datastates-llm", "config-n-run.py", "scripts")
"""What a block's result depends on: the code identity is the hash of these files' contents."""
CODE_EXCLUDED = ("bench/results/", "__pycache__/", ".pytest_cache/")
MARGIN_S, MARGIN_SHARE = 10.0, 0.15
"""A block starts when its expected seconds x (1 + MARGIN_SHARE) + MARGIN_S fit in what is left."""
RESERVE_S = 15.0
"""Kept back from every block's time limit: rewriting the ledger and the logs' archive after it."""
LOG_TAIL_LINES = 40
LOG_CUT_BYTES = (MiB, 128 * 1024)
TAR_LIMIT = 15 * MiB


class SessionError(RuntimeError):
    """A request the session cannot carry out; the message says what to do."""


# -- the code and the results already held ---------------------------------------------------------------------------


def code_identity(root: Path = ROOT) -> dict:
    """What a result is a result of: ``tree``, a SHA-256 over the path and git blob hash of every file under
    ``CODE_PATHS`` (results, caches and compiled files left out), computable where the checkout travels without its
    .git; ``commit``, git's HEAD where git can say (None elsewhere)."""
    lines = []
    for path in _code_files(root):
        data = path.read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        lines.append(f"{path.relative_to(root).as_posix()} {blob}\n")
    tree = hashlib.sha256("".join(lines).encode()).hexdigest()
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return {"tree": tree, "files": len(lines), "paths": list(CODE_PATHS),
            "commit": head.stdout.strip() if head.returncode == 0 else None}


def _code_files(root: Path) -> list[Path]:
    found = []
    for name in CODE_PATHS:
        top = root / name
        candidates = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        found += [p for p in candidates if not any(x in p.relative_to(root).as_posix() for x in CODE_EXCLUDED)]
    return found


def measured(block: Block, held: list[tuple[Path, dict]]) -> Block:
    """``block`` with the seconds it last took on this machine (``held``: its results, oldest first) as its expected
    seconds, where it ended ok: a measurement plans the next visit better than the first estimate."""
    last = next(((path, meta) for path, meta in reversed(held) if meta.get("status") == "ok" and meta.get("seconds")),
                None)
    if last is None:
        return block
    path, meta = last
    return dataclasses.replace(block, expected_s=float(meta["seconds"]),
                               basis=f"measured on this machine: {meta['seconds']:.0f} s on {meta.get('date')} "
                                     f"({path.name})")


def visit_order(blocks: list[Block], stale: set[str]) -> list[Block]:
    """The order a visit tries ``blocks`` in: those never measured on this machine first, in priority order, then
    those measured at other code (``stale``: refreshed as time allows). Code changes between visits; without this,
    each visit would spend its minutes measuring again the first blocks and never reach the last. A block moves up
    with the earliest block that needs it (``needs`` always come before their users in ``blocks``)."""
    rank = {b.name: (int(b.name in stale), i) for i, b in enumerate(blocks)}
    for block in reversed(blocks):
        for need in block.needs:
            rank[need] = (min(rank[need][0], rank[block.name][0]), rank[need][1])
    return sorted(blocks, key=lambda b: rank[b.name])


def gpu_machine() -> tuple[str, str | None]:
    """(the machine's name in results files, the GPU's full name), from nvidia-smi; ``cpuN`` where there is none."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return machine_name({}), None
    gpu = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
    return machine_name({"gpu": gpu}), gpu


# -- running ---------------------------------------------------------------------------------------------------------


def execute(command: Iterable[str], env: dict[str, str], timeout: float, log: Path) -> int:
    """Run one command line, its output appended to ``log``; its exit code, 124 when it ran past ``timeout`` (its
    process group is then ended: SIGTERM, SIGKILL 10 s later), 127 when it could not start."""
    command = list(command)
    with log.open("a") as out:
        out.write(f"\n$ {shlex.join(command)}\n")
        out.flush()
        try:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True)
        except OSError as error:
            out.write(f"could not start: {error}\n")
            return 127
        try:
            return proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=10)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            out.write(f"\n[gpu_session] stopped after {timeout:.0f} s: the budget's time for this block ran out\n")
            return 124


Execute = Callable[[Iterable[str], dict[str, str], float, Path], int]


@dataclass
class Session:
    """One visit's run of the blocks against its budget. ``clock`` (seconds, monotonic) and ``execute`` are
    injectable: the tests drive the budget with a clock of their own."""

    where: Where
    out: Path
    budget_s: float
    machine: str
    code: dict
    results: Path = ROOT / "bench" / "results"
    clock: Callable[[], float] = time.monotonic
    execute: Execute = execute
    ledger: dict = field(default_factory=dict)
    started: float = 0.0

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.started)

    def run(self, blocks: list[Block], only: list[str] | None, argv: list[str], gpu: str | None) -> dict:
        self.started = self.clock()
        self.where.work.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.ledger = load_ledger(self.out / LEDGER, self.code)
        self.ledger["session"].setdefault("visits", []).append(
            {"started": _now(), "argv": argv, "budget_s": self.budget_s, "gpu": gpu})
        self.ledger["session"].update(machine=self.machine, gpu=gpu, code=self.code)
        blocks = [measured(b, held_results(self.results, self.machine, b.name)) for b in blocks]
        wanted = selected(blocks, only, self.decide_held)
        for block in visit_order(blocks, self.stale(blocks)):
            if block.name in wanted:
                self.record(block, self.attempt(block, wanted[block.name]))
        self.write()
        return self.ledger

    def stale(self, blocks: list[Block]) -> set[str]:
        """The blocks that ended ok on this machine at other code and hold no result at this code. A block that only
        ever failed is not stale but unmeasured: its failure may be what the code changed for (the first H100 visit's
        probe failed for want of fio), so it keeps its place in the priority order."""
        return {b.name for b in blocks if not b.every_visit
                and any(meta.get("status") == "ok" for _, meta in held_results(self.results, self.machine, b.name))
                and not held_result(self.results, self.machine, self.code["tree"], b.name)}

    def decide_held(self, block: Block) -> str | None:
        """Why ``block`` need not run (held in bench/results or done in this output folder), else None."""
        if block.every_visit:
            return None
        earlier = self.ledger["blocks"].get(block.name, {})
        if earlier.get("status") in DONE and earlier.get("code") == self.code["tree"]:
            return f"done earlier in {self.out / LEDGER} ({earlier['status']})"
        held = held_result(self.results, self.machine, self.code["tree"], block.name)
        return f"held in {held}" if held else None

    def attempt(self, block: Block, why: str) -> dict:
        entry = {"status": None, "why": why, "expected_s": block.expected_s, "basis": block.basis,
                 "commands": [shlex.join(c) for c in block.commands], "code": self.code["tree"]}
        unmet = [n for n in block.needs if self.ledger["blocks"].get(n, {}).get("status") != "ok"
                 or self.ledger["blocks"][n].get("visit") != len(self.ledger["session"]["visits"])]
        needed = block.expected_s * (1 + MARGIN_SHARE) + MARGIN_S
        if why.startswith("skipped"):
            return {**entry, "status": "skipped"}
        if block.problem:
            return {**entry, "status": "failed", "error": block.problem, "seconds": 0.0}
        if unmet:
            return {**entry, "status": "blocked", "error": f"needs {', '.join(unmet)}, which did not end ok this visit"}
        if needed > self.left() - RESERVE_S:
            return {**entry, "status": "not started",
                    "error": f"does not fit: needs about {block.expected_s:.0f} s ({needed:.0f} s with the margin), "
                             f"{self.left() - RESERVE_S:.0f} s left"}
        return {**entry, **self.launch(block)}

    def launch(self, block: Block) -> dict:
        log, folder = self.where.log(block.name), self.where.block_dir(block.name)
        folder.mkdir(parents=True, exist_ok=True)
        env, start, began = block_env(self.where, block), self.clock(), _now()
        status, code, failed = "ok", 0, None
        for command in block.commands:
            code = self.execute(command, env, self.left() - RESERVE_S, log)
            if code != 0:
                status = "timed out" if code == 124 else "failed"
                failed = f"{shlex.join(command)} exited with {code}"
                break
        for command in block.cleanup:
            self.execute(command, env, 120, log)
        return {"status": status, "exit": code, "error": failed, "started": began, "ended": _now(),
                "seconds": self.clock() - start, "log_tail": log_tail(log) if failed else [],
                "files": block_files(folder)}

    def record(self, block: Block, entry: dict) -> None:
        entry["visit"] = len(self.ledger["session"]["visits"])
        self.ledger["blocks"][block.name] = entry
        print(f"[gpu_session] {block.name}: {entry['status']}" + (f" ({entry['error']})" if entry.get("error") else "")
              + (f" after {entry['seconds']:.0f} s" if entry.get("seconds") else "") + f"; {self.left():.0f} s left",
              flush=True)
        if "seconds" in entry:
            self.write()

    def write(self) -> None:
        LocalStore(self.out).write_durably(LEDGER, json.dumps(self.ledger, indent=1, default=str) + "\n")
        pack_logs(self.where.work, self.out / LOGS_TAR)


def selected(blocks: list[Block], only: list[str] | None, held: Callable[[Block], str | None]) -> dict[str, str]:
    """The blocks to try this visit, each with why: asked for (``only``, else all) and not held, then what they need."""
    names = [b.name for b in blocks]
    unknown = sorted(set(only or ()) - set(names) - {"engines-1B"})
    if unknown:
        raise SessionError(f"unknown block(s) {', '.join(unknown)}: choose among {', '.join(names)} (engines-1B: "
                           "every engines-1B-<engine> block)")
    asked = [b for b in blocks if not only or b.name in only or ("engines-1B" in only and
                                                                 b.name.startswith("engines-1B-"))]
    wanted: dict[str, str] = {}
    for block in asked:
        reason = held(block)
        wanted[block.name] = f"skipped: {reason}" if reason else "asked for"
    by_name = {b.name: b for b in blocks}
    for block in reversed(blocks):  # a block's needs come before it: one pass reaches their own needs
        if not wanted.get(block.name, "skipped").startswith("skipped"):
            for need in by_name[block.name].needs:
                if need not in wanted or wanted[need].startswith("skipped"):
                    wanted[need] = f"needed by {block.name}"
    return wanted


def load_ledger(path: Path | None, code: dict) -> dict:
    """The output folder's ledger (a session resumed in the same folder), else an empty one."""
    if path is not None and path.is_file():
        ledger = json.loads(path.read_text())
        if "blocks" in ledger and "session" in ledger:
            return ledger
        raise SessionError(f"{path} is not a gpu_session ledger: give another --out")
    return {"session": {"schema": 1, "code": code}, "blocks": {}}


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    if not log.is_file():
        return []
    with log.open("rb") as handle:
        handle.seek(max(0, log.stat().st_size - 64 * 1024))
        return handle.read().decode(errors="replace").splitlines()[-lines:]


def block_files(folder: Path, limit: int = 256 * 1024) -> dict:
    """The small files a block left in its folder (not its run folders): JSON parsed, other text as it is."""
    files = {}
    for path in sorted(p for p in folder.glob("*") if p.is_file() and p.stat().st_size <= limit):
        text = path.read_text(errors="replace")
        try:
            files[path.name] = json.loads(text) if path.suffix == ".json" else text
        except json.JSONDecodeError:
            files[path.name] = text
    return files


def pack_logs(work: Path, target: Path) -> None:
    """Every file under ``work`` but checkpoints and fio's files, text logs cut to their last MiB (less if the
    archive would pass ``TAR_LIMIT``), into one tar.gz, written atomically."""
    for cut in LOG_CUT_BYTES:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for path in sorted(p for p in work.rglob("*") if p.is_file() and _packed(p.relative_to(work))):
                data = path.read_bytes()
                if path.suffix == ".log" and len(data) > cut:
                    data = b"[cut: the first %d bytes left out]\n" % (len(data) - cut) + data[-cut:]
                info = tarfile.TarInfo(path.relative_to(work).as_posix())
                info.size, info.mtime = len(data), int(path.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
        if buffer.tell() <= TAR_LIMIT:
            break
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, target)


def _packed(relative: Path) -> bool:
    top = relative.parts[0]
    return top not in ("ckpt", "fio") and "checkpoints" not in relative.parts


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


# -- command line ----------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, help="seconds this command may take, start to end (status's "
                   "budget_left_s less the machine's start-up, at most the tool's 600 s per command)")
    p.add_argument("--out", type=Path, help="the folder that comes back ($OUT): ledger.json and logs.tar.gz")
    p.add_argument("--only", nargs="+", metavar="BLOCK", help="these blocks (and what they need) only; engines-1B "
                   "names every engine's block")
    p.add_argument("--dry-run", action="store_true", help="print each block's decision and command lines, run none")
    p.add_argument("--work", type=Path, default=Where.work, help="scratch folder on the machine (default: %(default)s)")
    p.add_argument("--import-results", type=Path, metavar="DIR",
                   help="write bench/results files from what a visit brought back in DIR, then stop")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results", help="results folder (default: "
                   "%(default)s)")
    return p


def dry_run(session: Session, blocks: list[Block], only: list[str] | None) -> None:
    session.ledger = load_ledger(session.out / LEDGER if session.out else None, session.code)
    blocks = [measured(b, held_results(session.results, session.machine, b.name)) for b in blocks]
    wanted = selected(blocks, only, session.decide_held)
    stale = session.stale(blocks)
    print(f"machine {session.machine}, code {session.code['tree'][:12]}, budget {session.budget_s:.0f} s")
    for block in visit_order(blocks, stale):
        decision = wanted.get(block.name, "not asked for") + (" (held at other code: after the others)"
                                                               if block.name in stale else "")
        print(f"\n[{block.name}] expected {block.expected_s:.0f} s — {decision}" +
              (f"\n  cannot run: {block.problem}" if block.problem else "") + f"\n  basis: {block.basis}")
        env = " ".join(f"{k}={v}" for k, v in block.env.items())
        for command in block.commands + block.cleanup:
            print(f"  {env + ' ' if env else ''}{shlex.join(command)}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        if args.import_results:
            for path in import_results(args.import_results, args.results):
                print(f"written: {path}")
            return 0
        if args.budget is None or args.budget <= 0 or (args.out is None and not args.dry_run):
            raise SessionError("give --budget SECONDS (above 0) and --out DIR (the folder that comes back), or "
                               "--import-results DIR")
        where = dataclasses.replace(Where(), work=args.work)
        machine, gpu = gpu_machine()
        session = Session(where, args.out, args.budget, machine, code_identity(), results=args.results)
        blocks = plan_blocks(where)
        if args.dry_run:
            dry_run(session, blocks, args.only)
            return 0
        ledger = session.run(blocks, args.only, argv, gpu)
    except (SessionError, ResultsError) as error:
        print(f"gpu_session: {error}", file=sys.stderr)
        return 2
    return 0 if all(b["status"] not in ("failed", "timed out") for b in ledger["blocks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
