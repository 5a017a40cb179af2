#!/usr/bin/env bash
# make setup: install the whole stack on a fresh Debian 12 machine, idempotently.
#   1. Debian packages: Open MPI, Slurm, munge (skipped when already installed)
#   2. .venv with torch (CPU), mpi4py, h5py, hydra, submitit, pytest, ...
#   3. Horovod 0.28.1 built from its PyPI source with the C++17 fix (torch 2.x headers need C++17),
#      MPI + Gloo controllers; the built wheel is cached so a second run takes seconds
#   4. a check of the build that fails loudly if anything is missing
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
WHEEL_CACHE=${HPC_RL_WHEEL_CACHE:-$HOME/.cache/hpc_rl/wheels}
log() { printf '[setup] %s\n' "$*"; }

# --- 1. Debian packages -------------------------------------------------------------------------
DEB_PKGS=(libopenmpi-dev openmpi-bin slurm-wlm munge cmake g++ make)
missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "Debian packages present"
fi

# --- 2. the virtual environment -----------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)
# The CPU build of torch is pinned: an unpinned torch pulls a multi-GB CUDA build.
if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION (CPU build)"
  "${PIP[@]}" "torch==$TORCH_VERSION"
fi
if ! "$PY" -c "import hpc_rl, mpi4py, h5py, hydra, submitit, pytest, scipy, gymnasium" 2>/dev/null \
   || [ pyproject.toml -nt "$VENV/.hpc_rl_installed" ]; then
  log "installing Python dependencies and hpc_rl (editable)"
  "${PIP[@]}" wheel setuptools packaging
  # mpi4py compiles against the MPI found on PATH (Debian's Open MPI here, the site's module on a cluster).
  "${PIP[@]}" -e ".[dev]" "torch==$TORCH_VERSION"
  touch "$VENV/.hpc_rl_installed"
fi

# --- 3. Horovod ---------------------------------------------------------------------------------
if ! "$PY" -c "import horovod.torch" 2>/dev/null; then
  mkdir -p "$WHEEL_CACHE"
  whl=$(ls "$WHEEL_CACHE"/horovod-$HOROVOD_VERSION-*.whl 2>/dev/null | head -1 || true)
  if [ -n "$whl" ] && "${PIP[@]}" --no-deps "$whl" && "${PIP[@]}" cloudpickle psutil pyyaml \
     && "$PY" -c "import horovod.torch" 2>/dev/null; then
    log "installed cached Horovod wheel $whl"
  else
    log "building Horovod $HOROVOD_VERSION from source (about 10 minutes on 2 cores)"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$build" "horovod==$HOROVOD_VERSION"
    tar -xzf "$build"/horovod-$HOROVOD_VERSION.tar.gz -C "$build"
    src="$build/horovod-$HOROVOD_VERSION"
    # torch 2.x headers need C++17; Horovod 0.28.1 pins C++14 in two CMake files.
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q "CMAKE_CXX_STANDARD 17" "$src/CMakeLists.txt" || { echo "C++17 patch did not apply" >&2; exit 1; }
    # Debian's cmake 3.25: a pip-installed cmake 4.x fails on Gloo's cmake_minimum_required.
    PATH="/usr/bin:$PATH" MAKEFLAGS="-j$(nproc)" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=MPI \
      "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$build/dist" "$src"
    cp "$build"/dist/horovod-*.whl "$WHEEL_CACHE"/
    "${PIP[@]}" --no-deps "$build"/dist/horovod-*.whl
    "${PIP[@]}" cloudpickle psutil pyyaml
  fi
else
  log "Horovod present"
fi

# --- 4. check -----------------------------------------------------------------------------------
"$PY" -c "import horovod.torch, mpi4py, h5py, hydra, submitit, torch, hpc_rl" \
  || { echo "[setup] FAILED: a package does not import" >&2; exit 1; }
check=$("$VENV/bin/horovodrun" --check-build)
echo "$check" | grep -q "\[X\] PyTorch" || { echo "$check"; echo "[setup] FAILED: Horovod lacks PyTorch" >&2; exit 1; }
echo "$check" | sed -n '/Available Controllers/,/Available Tensor/p' | grep -q "\[X\] MPI" \
  || { echo "$check"; echo "[setup] FAILED: Horovod lacks the MPI controller" >&2; exit 1; }
echo "$check" | sed -n '/Available Controllers/,/Available Tensor/p' | grep -q "\[X\] Gloo" \
  || { echo "$check"; echo "[setup] FAILED: Horovod lacks the Gloo controller" >&2; exit 1; }
for tool in mpirun sbatch slurmctld slurmd munged; do
  command -v "$tool" >/dev/null || { echo "[setup] FAILED: $tool not on PATH" >&2; exit 1; }
done
log "ok: $("$PY" -c 'import torch, mpi4py, horovod; print(f"torch {torch.__version__}, mpi4py {mpi4py.__version__}, horovod {horovod.__version__}")'), $(mpirun --version | head -1)"
