#!/usr/bin/env bash
# `make reproduce`: OpenAI Five's Figure 5 at small scale on the local Slurm cluster, all three panels: batch size
# (5a), staleness (5b) and sample reuse (5c), each a Hydra multirun of conf/experiment/figure5.yaml members (CartPole
# through the 6-rank pipeline) driven by hpc_rl/reproduce.py, then the plots and tables with their direction tests.
# Resumable: members already finished are skipped, so the sweeps can span sittings (run it again after a stop).
#   make reproduce                               # everything (docs/analysis.md gives the time it takes)
#   REPRO_PARALLEL=4 make reproduce              # members at once, on a machine with the cores for 4 x 6 ranks
#   REPRO_RUNS=runs/pilot REPRO_SEEDS="3 4" REPRO_VERSIONS=100 make reproduce   # a short pilot, kept apart
#   REPRO_PANELS="staleness reuse" make reproduce          # some panels only
#   REPRO_LAUNCHER=local REPRO_PARALLEL=4 PY=python3 bash scripts/reproduce.sh   # a node without Slurm (mpirun)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LAUNCHER=${REPRO_LAUNCHER:-slurm}              # local: each member an mpirun job on this node, no scheduler
OUT=${REPRO_OUT:-docs/figures/figure5}         # apart from the earlier MOBA sweeps' figures in docs/figures
RUNS=${REPRO_RUNS:-runs/figure5}
VERSIONS=${REPRO_VERSIONS:-250}                 # staleness and reuse members
BATCH_VERSIONS=${REPRO_BATCH_VERSIONS:-$((VERSIONS / 2))}
PARALLEL=${REPRO_PARALLEL:-1}                  # 2 cores: one 6-rank member at a time is fastest
PANELS=${REPRO_PANELS:-batch_size staleness reuse}
# Six seeds per value: p < 0.05 needs at least 4 against 4 (docs/analysis.md), and the seed-to-seed spread of the
# versions to a threshold (~15%) leaves 4 too few for effects below ~1.5x. Not the pilot's seeds (3, 4, 5) that
# chose the thresholds below, nor the seeds the defaults were tuned on (0, 1, 2).
SEEDS=${REPRO_SEEDS:-10 11 12 13 14 15}
# The reuse panel's test needs more: reuse 4 against 1 alone, 24 seeds each (seeds 30-53), the replication whose test
# was registered on an earlier 15-seed panel (docs/analysis.md, "Reuse: a registered replication"). Reuse 2 is one
# more value at the same cost (REPRO_REUSE_VALUES="1 2 4").
REUSE_SEEDS=${REPRO_REUSE_SEEDS:-${REPRO_SEEDS:-$(seq -s ' ' 30 53)}}
REUSE_VALUES=${REPRO_REUSE_VALUES:-1 4}
# Return thresholds (CartPole-v1 starts near 20 and ends at 500) and the one each panel's direction test uses, as
# a pilot suggested (docs/analysis.md): stale data sped up the first rise and slowed the approach to high returns,
# so staleness and reuse are tested at 350; the 4x batch's lead was widest at low returns and the batch members'
# budget is shorter, so batch size at 150. Other REPRO_*THRESHOLDS: the middle one unless REPRO_*TEST_THRESHOLD
# names one.
THRESHOLDS=${REPRO_THRESHOLDS:-150 250 350}
TEST_THRESHOLD=${REPRO_TEST_THRESHOLD:-$([ -n "${REPRO_THRESHOLDS:-}" ] || echo 350)}
# Reuse at 450: the data-limited members part at high returns (reuse 4 stalls short of them more often).
REUSE_THRESHOLDS=${REPRO_REUSE_THRESHOLDS:-250 350 450}
REUSE_TEST_THRESHOLD=${REPRO_REUSE_TEST_THRESHOLD:-$([ -n "${REPRO_REUSE_THRESHOLDS:-}" ] || echo 450)}
BATCH_THRESHOLDS=${REPRO_BATCH_THRESHOLDS:-100 150 200}
BATCH_TEST_THRESHOLD=${REPRO_BATCH_TEST_THRESHOLD:-}

[ "$LAUNCHER" = local ] || bash slurm/local_cluster.sh up
mkdir -p "$OUT" "$RUNS"
# shellcheck disable=SC2086  # the lists split into words on purpose
others=$(for panel in $PANELS; do [ "$panel" = reuse ] || echo "$panel"; done)
if [ -n "$others" ]; then
    $PY -m hpc_rl.reproduce --runs "$RUNS" --panels $others --seeds $SEEDS --versions "$VERSIONS" \
        --batch-versions "$BATCH_VERSIONS" --parallel "$PARALLEL" --launcher "$LAUNCHER" ${REPRO_OVERRIDES:-}
fi
if [[ " $PANELS " == *" reuse "* ]]; then
    $PY -m hpc_rl.reproduce --runs "$RUNS" --panels reuse --values $REUSE_VALUES --seeds $REUSE_SEEDS \
        --versions "$VERSIONS" --parallel "$PARALLEL" --launcher "$LAUNCHER" ${REPRO_OVERRIDES:-}
fi
echo "== plots ($(date +%H:%M))"
sweeps=()
for panel in $PANELS; do sweeps+=("$RUNS/$panel"); done
# stats/episode_return is already a mean over the last ten versions' episodes: no further smoothing.
$PY analysis/curves.py "${sweeps[@]}" --metric stats/episode_return --out "$OUT"
$PY analysis/data_quality.py "${sweeps[@]}" --out "$OUT"
for panel in $PANELS; do
    # Figure 5a's baseline is the paper's second-smallest batch (2 segments per learner); 5b's and 5c's the smallest
    # queue and reuse.
    if [ "$panel" = batch_size ]; then
        args=(--baseline 2 --thresholds $BATCH_THRESHOLDS
              ${BATCH_TEST_THRESHOLD:+--test-threshold $BATCH_TEST_THRESHOLD})
    elif [ "$panel" = reuse ]; then
        args=(--baseline smallest --thresholds $REUSE_THRESHOLDS
              ${REUSE_TEST_THRESHOLD:+--test-threshold $REUSE_TEST_THRESHOLD})
    else
        args=(--baseline smallest --thresholds $THRESHOLDS ${TEST_THRESHOLD:+--test-threshold $TEST_THRESHOLD})
    fi
    $PY analysis/speedup.py "$RUNS/$panel" --metric stats/episode_return "${args[@]}" --out "$OUT"
done
echo "plots and tables in $OUT"
