#!/usr/bin/env bash
# make test-light (and CI, .ci/run): the base install tier works without MPI, Horovod or Slurm.
#   1. a clean copy of the checkout (its tracked and unignored files: no build/ or compiled module of an earlier build)
#   2. a new virtual environment in a temporary directory, with `pip install .[test]` and the CPU torch that
#      scripts/setup.sh pins, as on a machine without MPI: MPICC names no wrapper, so the ring's C module is skipped
#   3. fails if mpi4py, Horovod, submitit or the ring's C module is installed there
#   4. runs the tests marked light (not those also marked slow: the full suite runs them) in that environment, where
#      a test or module that imports one of them fails
# Needs python3 with venv and pip's index (a cache makes a second run mostly offline); KEEP=1 keeps the directory.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=$(sed -n 's/^TORCH_VERSION=//p' scripts/setup.sh)
log() { printf '[light] %s\n' "$*"; }
fail() { printf '[light] FAILED: %s\n' "$*" >&2; exit 1; }
[ -n "$TORCH_VERSION" ] || fail "scripts/setup.sh pins no TORCH_VERSION"

WORK=$(mktemp -d -t hpc_rl-light.XXXXXX)
[ "${KEEP:-0}" = 1 ] && log "keeping $WORK" || trap 'rm -rf "$WORK"' EXIT
SRC="$WORK/src" VENV="$WORK/venv"
start=$SECONDS

# --- 1. the checkout, clean -----------------------------------------------------------------------
mkdir "$SRC"
git ls-files -z --cached --others --exclude-standard \
  | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$SRC"

# --- 2. the base tier -----------------------------------------------------------------------------
python3 -m venv "$VENV"
log "pip install .[test] torch==$TORCH_VERSION into $VENV (the ring's C module skipped: no MPI compiler wrapper)"
# -v: pip shows what setup.py prints only when verbose; the log keeps it.
if ! MPICC="$WORK/no-mpicc" "$VENV/bin/python" -m pip install -v --disable-pip-version-check "$SRC[test]" \
    "torch==$TORCH_VERSION" >"$WORK/pip.log" 2>&1; then
  tail -40 "$WORK/pip.log"
  fail "pip install of the base tier failed (log above)"
fi
grep -m1 -o "hpc_rl: skipped the experience ring's C module.*" "$WORK/pip.log" \
  || fail "setup.py did not say that it skipped the ring's C module"
log "installed in $((SECONDS - start)) s"

# --- 3. none of the other tiers' packages ---------------------------------------------------------
(cd "$WORK" && "$VENV/bin/python" - "$VENV") <<'EOF' || fail "the base tier installed what it must not (above)"
import importlib.util, sys
import hpc_rl
assert hpc_rl.__file__.startswith(sys.argv[1]), f"hpc_rl imports from {hpc_rl.__file__}, not from the new venv"
present = [name for name in ("mpi4py", "horovod", "submitit", "hydra_plugins.hydra_submitit_launcher",
                             "hpc_rl.transport._ring") if importlib.util.find_spec(name) is not None]
assert not present, f"installed in the base tier: {present}"
EOF

# --- 4. the light tests ---------------------------------------------------------------------------
# Only the test modules that mark tests light are collected: the others may import the other tiers' packages. The
# venv's pytest script, not `python -m pytest`, so that hpc_rl is the installed one, not the copy's sources.
cd "$SRC"
mapfile -t modules < <(grep -l "pytest.mark.light" tests/test_*.py)
[ ${#modules[@]} -gt 0 ] || fail "no test module marks tests light"
OMP_NUM_THREADS=1 "$VENV/bin/pytest" -q -ra -p no:cacheprovider -m "light and not slow" "${modules[@]}" \
  || fail "the light tests failed in the base tier"
log "ok in $((SECONDS - start)) s: the base tier installs and its tests pass without mpi4py, Horovod or submitit"
