#!/usr/bin/env bash
# make setup: install the whole stack on a fresh Debian 12 machine, idempotently.
#   1. Debian packages: Open MPI, Slurm, munge, a C++ toolchain and cmake (skipped when installed)
#   2. .venv with torch (CPU build), mpi4py, h5py, hydra, submitit, pytest and hpc_rl (editable, .[dev]: every
#      install tier; its C module is built with mpicc)
#   3. Horovod 0.28.1 with the C++17 fix (scripts/build_horovod.sh; the wheel is cached, so a second run is fast)
#   4. a check that fails loudly if anything is missing
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-$PWD/.venv}
TORCH_VERSION=2.13.0
log() { printf '[setup] %s\n' "$*"; }
fail() { printf '[setup] FAILED: %s\n' "$*" >&2; exit 1; }

# --- 1. Debian packages -------------------------------------------------------------------------
DEB_PKGS=(libopenmpi-dev openmpi-bin slurm-wlm munge cmake g++ make iproute2 gdb)
missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
log "Debian packages: ${DEB_PKGS[*]}"

# --- 2. the virtual environment -----------------------------------------------------------------
[ -x "$VENV/bin/python" ] || { log "creating $VENV"; python3 -m venv "$VENV"; }
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)
# Pinned CPU build: an unpinned torch pulls a multi-GB CUDA build.
if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION (CPU build)"
  "${PIP[@]}" "torch==$TORCH_VERSION"
fi
# hpc_rl's C module (the experience ring's MPI calls, hpc_rl/transport/_ring.c) and mpi4py need Python's headers.
include=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
[ -f "$include/Python.h" ] || fail "$include/Python.h is missing: install your Python's headers (Debian: python3-dev)"
stamp="$VENV/.hpc_rl_installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] \
    || [ hpc_rl/transport/_ring.c -nt "$stamp" ] || ! "$PY" -c "import hpc_rl.transport._ring" 2>/dev/null; then
  log "installing hpc_rl (editable, building its C module with mpicc) and its dependencies"
  "${PIP[@]}" setuptools wheel
  # mpi4py and hpc_rl's C module compile against the MPI on PATH: Debian's Open MPI here, the site's MPI module on
  # a cluster.
  "${PIP[@]}" -e ".[dev]" "torch==$TORCH_VERSION"
  touch "$stamp"
fi

# --- 3. Horovod ---------------------------------------------------------------------------------
if "$PY" -c "import horovod.torch" 2>/dev/null; then
  log "Horovod present"
else
  bash scripts/build_horovod.sh "$PY"
fi

# --- 4. compile the environments' numba kernels (the MOBA's, Go's) once (cached beside the sources), so that MPI
#        ranks starting together do not each spend ~30 s compiling them
"$PY" -c "from hpc_rl.envs.scripted import warm_up; warm_up()" || fail "the environment's kernels do not compile"
"$PY" -c "from hpc_rl.envs.go import warm_up; warm_up()" || fail "the Go engine's kernels do not compile"
"$PY" -c "from hpc_rl.envs.go_search import warm_up; warm_up()" || fail "the Go search's kernels do not compile"

# --- 5. check -----------------------------------------------------------------------------------
"$PY" -c "import horovod.torch, mpi4py, h5py, hydra, submitit, torch, gymnasium, pettingzoo, mpe2, pyspiel, onnxruntime, \
onnxscript, hpc_rl, hpc_rl.transport._ring" \
  || fail "a package does not import"
check=$("$VENV/bin/horovodrun" --check-build)
controllers=$(echo "$check" | sed -n '/Available Controllers/,/Available Tensor/p')
echo "$check" | grep -q "\[X\] PyTorch" || { echo "$check"; fail "Horovod was built without PyTorch"; }
echo "$controllers" | grep -q "\[X\] MPI" || { echo "$check"; fail "Horovod lacks the MPI controller"; }
echo "$controllers" | grep -q "\[X\] Gloo" || { echo "$check"; fail "Horovod lacks the Gloo controller"; }
for tool in mpirun sbatch srun slurmctld slurmd munged; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH"
done
log "ok: $("$PY" -c 'import torch, mpi4py, horovod; print(f"torch {torch.__version__}, mpi4py {mpi4py.__version__}, horovod {horovod.__version__}")'), $(mpirun --version | head -1)"
