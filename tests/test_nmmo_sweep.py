"""analysis/nmmo_sweep.py (docs/nmmo.md, "Sweeps"): its pure helpers by hand, the sweep configs composed, and the
script on two tiny trained runs that differ in their agent cap."""

import dataclasses
import importlib.util
import math
import sys

import pytest
from hydra import compose, initialize_config_dir

from hpc_rl.config import build_config, register
from hpc_rl.runner import SerialRunner
from test_nmmo_measures import ROOT, WORLD, tiny_config


def load_script(path):
    """A script's module, imported from its file and registered (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = sys.modules[path.stem] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sweep = load_script(ROOT / "analysis" / "nmmo_sweep.py")


def member(value: int, seed: int, ratio_of: float = 2.0, between: float | None = None) -> "sweep.Member":
    return sweep.Member(f"m{value}-{seed}", value, seed, 10, (ratio_of * 5.0, 4.0, 6.0), (5.0, 4.0, 6.0),
                        (9.0, 8.0, 10.0), 4.0, 0.5, 0.2, between, 0.3, 0.1, 0.5, None, 0.0)


def test_swept_setting_seed_interval_and_grouping():
    configs = [{"env": {"nmmo": {"populations": p, "num_agents": 32}}} for p in (1, 2, 4)]
    assert sweep.swept_setting(configs) == "env.nmmo.populations"
    assert sweep.swept_setting(configs[:1], "env.nmmo.num_agents") == "env.nmmo.num_agents"
    for bad in (configs[:1], [{"env": {"nmmo": {"populations": p, "num_agents": p}}} for p in (1, 2)]):
        with pytest.raises(ValueError, match="--param"):
            sweep.swept_setting(bad)

    # Three seeds: mean ± t(0.975, 2) · s / √3, t = 4.3027; one seed: no interval; a missing figure is left out.
    mean, low, high = sweep.seed_interval([1.0, 2.0, None, 3.0])
    assert mean == 2.0 and high - mean == pytest.approx(4.302653 * 1.0 / math.sqrt(3), rel=1e-5) and low < mean
    assert sweep.seed_interval([5.0])[0] == 5.0 and math.isnan(sweep.seed_interval([5.0])[1])
    assert all(math.isnan(x) for x in sweep.seed_interval([None]))

    groups = sweep.by_value([member(4, 5), member(1, 4), member(4, 3), member(2, 3)])
    assert list(groups) == [1, 2, 4] and [m.seed for m in groups[4]] == [3, 5]
    assert member(1, 3, ratio_of=3.0).ratio == 3.0
    assert member(1, 3).niche_excess is None and member(2, 3, between=0.25).niche_excess == pytest.approx(0.15)


@pytest.mark.parametrize("ablation, key, values", [("nmmo_populations", "populations", (1, 2, 4, 8)),
                                                    ("nmmo_agents", "num_agents", (16, 32, 64, 128))])
def test_sweep_configs_compose_for_every_member(ablation, key, values):
    """Every member of the two sweeps builds a valid config: a learner for each population, the time budget and the
    final evaluation on (what the Slurm launcher checks before it submits)."""
    register()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for value in values:
            cfg = compose("train", overrides=["experiment=nmmo", f"ablation={ablation}", f"env.nmmo.{key}={value}",
                                              "runs_dir=runs/x"])
            config = build_config(cfg)
            assert getattr(config.env.nmmo, key) == value and config.pipeline.max_run_seconds > 0
            assert config.pipeline.final_eval_games > 0 and config.topology.learner >= config.populations


@pytest.mark.timeout(240)  # the first use of the world compiles its kernels
def test_script_on_two_runs_of_different_agent_caps(tmp_path):
    for agents in (8, 4):
        config = tiny_config(tmp_path)
        SerialRunner(dataclasses.replace(config, run_name=f"agents{agents}",
                                         env=dataclasses.replace(config.env, nmmo=dataclasses.replace(
                                             WORLD, num_agents=agents)))).run()
    out = tmp_path / "plots"
    assert sweep.run_script(sweep.parser(), sweep.body, [str(tmp_path / "agents8"), str(tmp_path / "agents4"),
                                                         "--out", str(out)]) == 0
    table = (out / "sweep.md").read_text().splitlines()
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in table if line.startswith("| ")]
    assert rows[0][0] == "env.nmmo.num_agents" and [r[0] for r in rows[1:3]] == ["4", "8"]
    for row in rows[1:3]:  # one population: no divergence between populations, a split-half baseline
        assert float(row[6]) > 0 and 0 < float(row[9]) <= 1 and row[11] == "-" and 0 < float(row[12]) <= 1
        assert row[13] == row[14] == "-"  # no shuffled baseline either
    assert [r[:2] for r in rows[4:]] == [["4", "1"], ["8", "1"]] and rows[4][-1] == "-"  # no niches with one
    assert (out / "sweep.png").stat().st_size > 0
    with pytest.raises(SystemExit) as usage:  # one run: no swept setting to tell
        sweep.run_script(sweep.parser(), sweep.body, [str(tmp_path / "agents8"), "--out", str(out)])
    assert usage.value.code == 2
