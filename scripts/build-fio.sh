#!/usr/bin/env bash
# A static fio for the lent GPU machines, whose image has none: without it bench/limits.py measures with dd, one
# block at a time (queue depth 1), and its limits are only lower bounds, too low to judge an engine against.
#   scripts/build-fio.sh OUT_DIR        -> OUT_DIR/fio (static, stripped) and OUT_DIR/fio.version
# Built from Debian's own source package of the fio this machine's apt offers (3.33 on bookworm, the fio the CPU
# machines run), with libaio linked in statically (Debian's libaio-dev .deb, unpacked here) and without the engines
# that need other libraries (rbd, gluster, rdma, pmem, nfs, http...): the probe uses libaio, psync and sync only.
# bench/gpu-session.sh puts it on the PATH there. Kept when OUT_DIR already holds one of the same version.
set -euo pipefail
OUT="${1:?usage: scripts/build-fio.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
command -v apt-get >/dev/null || { echo "[build-fio] no apt-get here: no fio built" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# A private apt state that also knows Debian's source packages, so the machine's own lists stay untouched.
codename="$(. /etc/os-release && echo "${VERSION_CODENAME:?}")"
mkdir -p "$WORK/sources" "$WORK/lists/partial" "$WORK/src" "$WORK/aio"
cat >"$WORK/sources/debian-src.sources" <<EOF
Types: deb deb-src
URIs: http://deb.debian.org/debian
Suites: $codename
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
PRIVATE=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$WORK/sources" -o "Dir::State::Lists=$WORK/lists"
         -o "APT::Sandbox::User=root")
APT=(apt-get -q "${PRIVATE[@]}")
"${APT[@]}" update >"$WORK/apt.log" 2>&1 || { cat "$WORK/apt.log" >&2; exit 1; }
version="$(apt-cache "${PRIVATE[@]}" showsrc fio | sed -n 's/^Version: //p' | sort -V | tail -1)"
[[ -n "$version" ]] || { echo "[build-fio] Debian's source index has no fio" >&2; exit 1; }
if [[ -x "$OUT/fio" && "$(cat "$OUT/fio.version" 2>/dev/null)" == "$version" ]]; then
    echo "[build-fio] $OUT/fio is fio $version already" >&2
    exit 0
fi
(cd "$WORK/src" && "${APT[@]}" source --download-only "fio=$version" >"$WORK/source.log" 2>&1) \
    || { cat "$WORK/source.log" >&2; exit 1; }
(cd "$WORK/aio" && "${APT[@]}" download libaio-dev >"$WORK/aio.log" 2>&1) || { cat "$WORK/aio.log" >&2; exit 1; }
dpkg -x "$WORK"/aio/libaio-dev_*.deb "$WORK/aio/root"
libaio_a="$(find "$WORK/aio/root" -name libaio.a | head -1)"
[[ -n "$libaio_a" ]] || { echo "[build-fio] Debian's libaio-dev has no libaio.a" >&2; exit 1; }
tar -xzf "$WORK"/src/fio_*.orig.tar.gz -C "$WORK/src"
cd "$WORK"/src/fio-*/
start=$SECONDS
LDFLAGS="-L$(dirname "$libaio_a")" ./configure --build-static --disable-native --disable-numa --disable-rdma --disable-rados --disable-rbd \
    --disable-http --disable-gfapi --disable-libnfs --disable-pmem --disable-xnvme --disable-libzbc \
    --disable-tcmalloc --disable-dfs --extra-cflags="-I$WORK/aio/root/usr/include" \
    >"$WORK/configure.log" 2>&1 || { cat "$WORK/configure.log" >&2; exit 1; }
make -j"$(nproc)" fio >"$WORK/make.log" 2>&1 || { tail -40 "$WORK/make.log" >&2; exit 1; }
# What the probe needs of it, checked here rather than found missing on the GPU machine.
engines="$(./fio --enghelp)"
for engine in libaio psync sync; do
    grep -qw "$engine" <<<"$engines" || { echo "[build-fio] the build lacks fio's $engine engine" >&2; exit 1; }
done
if ldd ./fio >/dev/null 2>&1; then
    echo "[build-fio] the build is not static: $(ldd ./fio | tr '\n' ' ')" >&2
    exit 1
fi
strip -o "$OUT/fio.tmp" ./fio
mv "$OUT/fio.tmp" "$OUT/fio"
echo "$version" >"$OUT/fio.version"
echo "[build-fio] fio $version (Debian's source, static: libaio, psync, sync) -> $OUT/fio in $((SECONDS - start)) s" >&2
