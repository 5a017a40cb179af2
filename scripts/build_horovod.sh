#!/usr/bin/env bash
# Build and install Horovod 0.28.1 for PYTHON (default: python on PATH) with the PyTorch framework and the MPI and
# Gloo controllers. Horovod's last release pins C++14 in two CMake files; torch 2.x headers need C++17, so the
# source is patched before building. The wheel is cached in HPC_RL_WHEEL_CACHE (default ~/.cache/hpc_rl/wheels) and
# reused while it still imports.
#
#   scripts/build_horovod.sh [PYTHON]
#   HOROVOD_GPU_OPERATIONS=NCCL scripts/build_horovod.sh      # on GPU nodes (CUDA build of torch installed)
set -euo pipefail
PY=${1:-python}
VERSION=0.28.1
CACHE=${HPC_RL_WHEEL_CACHE:-$HOME/.cache/hpc_rl/wheels}
PIP=("$PY" -m pip install -q --disable-pip-version-check)
log() { printf '[build_horovod] %s\n' "$*"; }

"$PY" -c "import torch" 2>/dev/null || { echo "torch must be installed in $PY before building Horovod" >&2; exit 1; }
# Horovod's runtime dependencies (installed apart from the wheel, which is installed with --no-deps).
"${PIP[@]}" cloudpickle psutil pyyaml packaging

mkdir -p "$CACHE"
# The cached wheel was built against one torch: a wheel built for another one fails to import and is rebuilt.
torch_tag=$("$PY" -c "import torch; print(torch.__version__.replace('+', '_'))")
cached="$CACHE/torch-$torch_tag"
whl=$(ls "$cached"/horovod-$VERSION-*.whl 2>/dev/null | head -1 || true)
if [ -n "$whl" ]; then
  "${PIP[@]}" --no-deps --force-reinstall "$whl"
  if "$PY" -c "import horovod.torch" 2>/dev/null; then
    log "installed cached wheel $whl"
    exit 0
  fi
  log "cached wheel $whl does not import; rebuilding"
fi

log "building Horovod $VERSION from source (about 10 minutes on 2 cores)"
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$build" "horovod==$VERSION"
tar -xzf "$build/horovod-$VERSION.tar.gz" -C "$build"
src="$build/horovod-$VERSION"
sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
  grep -q "CMAKE_CXX_STANDARD 17" "$f" || { echo "the C++17 patch did not apply to $f" >&2; exit 1; }
done
# Debian's cmake 3.25 comes first: a pip-installed cmake 4.x fails on Gloo's cmake_minimum_required.
PATH="/usr/bin:$PATH" MAKEFLAGS="-j$(nproc)" \
  HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
  HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_CPU_OPERATIONS=${HOROVOD_CPU_OPERATIONS:-MPI} \
  "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$build/dist" "$src"
mkdir -p "$cached"
cp "$build"/dist/horovod-*.whl "$cached/"
"${PIP[@]}" --no-deps --force-reinstall "$build"/dist/horovod-*.whl
"$PY" -c "import horovod.torch" || { echo "Horovod was built but does not import" >&2; exit 1; }
log "built and cached $(ls "$cached"/horovod-*.whl)"
