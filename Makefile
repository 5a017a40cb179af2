# hpc_rl: the two commands a new user needs are `make train` and `make test` (both run `make setup` first).
SHELL := /bin/bash
PY := .venv/bin/python
PYTEST_ARGS ?=
BENCHES ?= env go transport learner learning e2e surgery
export OMP_NUM_THREADS := 1

.PHONY: setup test test-fast test-light train bench reproduce reproduce-1v1 figure6 cluster-up cluster-down clean help

help:
	@echo "make setup      install Open MPI, Slurm, munge, the .venv (torch CPU, mpi4py, h5py, hydra, submitit) and Horovod"
	@echo "make train      setup + a small real training job on the embedded default environment, then its replay.gif"
	@echo "make test       setup + the test suite (real MPI ranks, real Horovod, the local Slurm cluster)"
	@echo "make test-fast  the tests not marked slow, slurm or mpi"
	@echo "make test-light the base install tier (pip install ., no MPI) in a new venv, and its tests there (CI runs it)"
	@echo "make bench      setup + every benchmark, one JSON line each (BENCHES=\"$(BENCHES)\")"
	@echo "make reproduce  setup + OpenAI Five's Figure 5 (batch size, staleness, reuse sweeps) on the local Slurm, resumable; plots in docs/figures/figure5"
	@echo "make reproduce-1v1   setup + MOBA 1v1 (small map) trained 60 CPU-minutes against the scripted bot, then 400 evaluation games"
	@echo "make figure6 RUN=<run>   setup + OpenAI Five's Figure 6: a trained MOBA run resumed at 5 horizons on the local Slurm, rated against itself; docs/figures/figure6"
	@echo "make cluster-up / cluster-down   the local single-node Slurm cluster"

setup:
	@bash scripts/setup.sh

test: setup
	$(PY) -m pytest -ra --durations=15 $(PYTEST_ARGS) tests

test-fast: setup
	$(PY) -m pytest -ra -m "not slow and not slurm and not mpi" $(PYTEST_ARGS) tests

# Needs no `make setup`: it installs the base tier in a temporary venv of its own (scripts/light_tier_check.sh).
test-light:
	bash scripts/light_tier_check.sh

# The default local job: 5 ranks (1 controller, 2 env, 1 inference, 1 learner: the preset's topology) on MOBA 1v1 for
# at most 10 minutes, then a replay of its latest checkpoint against the scripted bot in $(RUNS_DIR)/$(RUN)/replay.gif (MOBA runs only: the
# leading '-' lets a Gymnasium run, which has no replay, end the target without failing it).
TRAIN_RANKS ?= 5
# The MOBA's training preset: every copy against the scripted bot, kickstarted by it (conf/experiment/moba_kickstart.yaml;
# the plain defaults win none of 100 games after 10 minutes; docs/envs.md). `TRAIN_PRESET= TRAIN_RANKS=6` trains with
# the plain defaults (their topology has 2 learners).
TRAIN_PRESET ?= experiment=moba_kickstart
TRAIN_ARGS ?= pipeline.max_versions=5000 pipeline.max_seconds=600
RUNS_DIR ?= runs
# The run's name (RUN=<name> names it, or resumes that run), expanded once so that both commands name the same run.
RUN ?= local-$(shell date +%Y%m%d-%H%M%S)
RUN := $(RUN)
train: setup
	$(PY) -m hpc_rl.launch $(TRAIN_RANKS) jobs/train.py run_name=$(RUN) runs_dir=$(RUNS_DIR) $(TRAIN_PRESET) $(TRAIN_ARGS)
	-$(PY) -m hpc_rl.envs.render --run $(RUNS_DIR)/$(RUN)

bench: setup
	@for b in $(BENCHES); do echo "== $$b"; $(PY) -m hpc_rl.bench $$b --json || exit 1; done

reproduce: setup
	bash scripts/reproduce.sh

REPRO_MINUTES ?= 60
reproduce-1v1: setup
	$(PY) jobs/vs_scripted.py --minutes $(REPRO_MINUTES) --clock cpu env=moba_1v1_small \
		run_name=vs_scripted-$$(date +%Y%m%d-%H%M%S)

# OpenAI Five's Figure 6 (hpc_rl/horizon.py; docs/analysis.md, "Figure 6"): RUN, a trained MOBA run (a name under
# $(RUNS_DIR) or a path; read only), resumed at horizons 45 .. 720 s, each member one Slurm array task; resumable.
# e.g. make figure6 RUN=c60 FIGURE6_ARGS="--versions 300 --games 200"
FIGURE6_ARGS ?=
figure6: setup
	@[ "$(origin RUN)" = "command line" ] || { echo "make figure6 needs RUN=<a trained MOBA run: a name under $(RUNS_DIR) or a path>"; exit 2; }
	bash slurm/local_cluster.sh up
	$(PY) -m hpc_rl.horizon $(if $(wildcard $(RUNS_DIR)/$(RUN)/config.yaml),$(RUNS_DIR)/$(RUN),$(RUN)) $(FIGURE6_ARGS)

cluster-up:
	@bash slurm/local_cluster.sh up

cluster-down:
	@bash slurm/local_cluster.sh down

clean:
	rm -rf runs outputs multirun .pytest_cache
