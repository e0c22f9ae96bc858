#!/usr/bin/env bash
# scripts/build-datastates.sh [TARGET]   (TARGET defaults to /tmp/site)
# scripts/build-datastates.sh --stamp    prints what a build is made from (the vendored source's files, this torch)
# scripts/build-datastates.sh --check [TARGET]   exit 0 if TARGET holds a build of that stamp, else 1
#
# A build writes its stamp to TARGET/datastates/BUILT; a later call on the same machine (a visit's second command)
# finds it current and skips the build (after the import check).
#
# Builds DataStates-LLM (third_party/datastates-llm, vendored unchanged; see its VENDORED.md) into TARGET with this
# machine's nvcc and CUDA torch, adds the study's adapter as datastates/__init__.py, and prints the import check.
# CUDA only. Then: export PYTHONPATH=TARGET:$PWD (the adapter lives in restartbench) and run --engine datastates.
#
#   - pip install --no-build-isolation --no-deps from a copy of the source (the vendored folder gets no build outputs);
#     MAX_JOBS (default 16) and TORCH_CUDA_ARCH_LIST (default 9.0: H100/H200) are passed to torch's extension build,
#     and CPPFLAGS with -include cstdint (DATASTATES_CPPFLAGS below says why).
#   - Their setup.py's find_packages() finds no package (datastates/ has no __init__.py), so pip installs the compiled
#     extension (datastates/ckpt/src*.so) alone: their Python modules (ckpt, llm, utils) are copied beside it as they
#     are. The adapter, restartbench/engines/deepspeed/datastates_adapter.py, says why and what it does.
#   PYTHON (default python3) is the Python that builds and runs it. CUDA_HOME, unset, is the folder nvcc runs from
#   (torch's own guess, the folder above the nvcc on PATH, is wrong where that nvcc is a wrapper script).
set -euo pipefail

PY="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/third_party/datastates-llm"
# Their common/mem_region.hpp uses uint64_t without including <cstdint>. Older libstdc++ headers (GCC 12's, which
# compiled it on the CPU machine) include it on the way; newer ones do not, and the H100 image's g++ (/opt/gcc)
# stopped on 2026-11-27 at "'uint64_t' does not name a type". The source stays as upstream wrote it: the compiler is
# told to include <cstdint> first in every file (setuptools adds CPPFLAGS to torch's extension compiles).
DATASTATES_CPPFLAGS="-include cstdint"

stamp() {  # sha256 of every vendored file (path and content, in name order) and of this Python's torch version
    { (cd "$SRC" && find . -type f -not -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
      "$PY" -c 'import torch; print("torch", torch.__version__)'; echo "CPPFLAGS $DATASTATES_CPPFLAGS"; } \
        | sha256sum | cut -d' ' -f1
}

built() {  # TARGET ($1) holds a build of this stamp
    [ -f "$1/datastates/BUILT" ] && [ "$(cat "$1/datastates/BUILT")" = "$(stamp)" ]
}

case "${1:-}" in
    --stamp) stamp; exit 0 ;;
    --check) built "${2:-/tmp/site}"; exit $? ;;
esac
TARGET="${1:-/tmp/site}"

cuda_only() {
    echo "build-datastates.sh: DataStates-LLM is CUDA only: $1." >&2
    echo "  Its engine is a torch CUDAExtension (nvcc) that copies GPU tensors into a pinned host cache." >&2
    echo "  Run it on a GPU machine with a CUDA build of torch and nvcc: bash scripts/build-datastates.sh /tmp/site," >&2
    echo "  then export PYTHONPATH=/tmp/site:\$PWD there; on a machine without CUDA the engine's runs are skipped." >&2
    exit 3
}

TORCH_CUDA="$("$PY" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null)" \
    || cuda_only "$PY cannot import torch"
[ -n "$TORCH_CUDA" ] || cuda_only "this torch ($("$PY" -c 'import torch; print(torch.__version__)')) is a CPU build"
NVCC="${CUDA_HOME:+$CUDA_HOME/bin/}nvcc"
command -v "$NVCC" >/dev/null || NVCC="$(command -v nvcc || true)"
[ -n "$NVCC" ] || cuda_only "no nvcc (set CUDA_HOME or put nvcc on PATH)"
# torch's extension build takes CUDA's headers and libraries from CUDA_HOME (or CUDA_PATH), else from the folder above
# the nvcc on PATH: wrong where that nvcc is a wrapper script. On the 2-core CPU machine /usr/local/bin/nvcc execs
# /usr/local/cuda-13.0/bin/nvcc, torch took /usr/local, and g++ stopped at the first '#include <cuda_runtime.h>'.
# Unset, CUDA_HOME is where nvcc itself runs from (its --dryrun names it _HERE_).
CUDA_HOME="${CUDA_HOME:-${CUDA_PATH:-}}"
[ -n "$CUDA_HOME" ] || CUDA_HOME="$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 \
    | sed -n 's|^#\$ _HERE_=\(.*\)/bin/*$|\1|p' | head -n 1 || true)"
[ -n "$CUDA_HOME" ] \
    || cuda_only "$(command -v "$NVCC") does not say where CUDA lies (no _HERE_ in its --dryrun): set CUDA_HOME"
[ -f "$CUDA_HOME/include/cuda_runtime.h" ] || cuda_only "no cuda_runtime.h in $CUDA_HOME/include (set CUDA_HOME)"
export CUDA_HOME

if built "$TARGET"; then
    echo "build-datastates.sh: $TARGET already holds a build of this source and torch (stamp $(stamp | cut -c1-12)):" \
         "not built again"
    PYTHONPATH="$TARGET:$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c 'from datastates import CheckpointEngine; \
from datastates.ckpt.src import handle; print("import check: datastates.CheckpointEngine and its compiled engine")'
    exit 0
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cp -r "$SRC" "$WORK/datastates-llm"
echo "build-datastates.sh: building $SRC (commit $(awk '/^- Commit:/{gsub("`","");print $3}' "$SRC/VENDORED.md")) into $TARGET" \
     "with torch CUDA $TORCH_CUDA, $("$NVCC" --version | tail -1), CUDA_HOME=$CUDA_HOME, MAX_JOBS=${MAX_JOBS:-16}," \
     "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}, CPPFLAGS=$DATASTATES_CPPFLAGS${CPPFLAGS:+ $CPPFLAGS}"
mkdir -p "$TARGET"
start=$SECONDS
MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
    CPPFLAGS="$DATASTATES_CPPFLAGS${CPPFLAGS:+ $CPPFLAGS}" "$PY" -m pip install --no-build-isolation --no-deps --no-index \
    --no-cache-dir --upgrade --target "$TARGET" \
    "$WORK/datastates-llm"
echo "build-datastates.sh: pip install took $((SECONDS - start)) s"

(cd "$WORK/datastates-llm" && find datastates -name '*.py' -not -path 'datastates/tests/*' \
    -exec cp --parents {} "$TARGET/" \;)
cat > "$TARGET/datastates/__init__.py" <<'EOF'
"""Written by restartbench's scripts/build-datastates.sh; not part of DataStates-LLM, whose source has no
datastates/__init__.py. DeepSpeed 0.19.8 imports datastates.CheckpointEngine: the study's adapter over
datastates.llm.Checkpointing (restartbench/engines/deepspeed/datastates_adapter.py says what it does)."""
from restartbench.engines.deepspeed.datastates_adapter import CheckpointEngine

__all__ = ["CheckpointEngine"]
EOF

PYTHONPATH="$TARGET:$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'EOF'
import inspect

import torch

import datastates
import datastates.llm
from datastates import CheckpointEngine
from datastates.ckpt.src import handle

print("import check: datastates.CheckpointEngine", inspect.signature(CheckpointEngine),
      "from", inspect.getsourcefile(CheckpointEngine))
print("import check: datastates.llm.Checkpointing from", inspect.getsourcefile(datastates.llm.Checkpointing))
print("import check: compiled engine", handle, "from", datastates.ckpt.src.__file__)
print("import check: torch", torch.__version__, "CUDA available:", torch.cuda.is_available())
EOF
stamp > "$TARGET/datastates/BUILT"
echo "build-datastates.sh: done; use it with: export PYTHONPATH=$TARGET:$ROOT"
