"""analysis/seed_groups.py: runs' checkpoint evaluations read at one version per group, summarised per group and
tested over seeds against the first group by ranks; bad requests refused with the reason."""

import importlib.util
from math import comb
from pathlib import Path

import pytest

from hpc_rl.storage.run import record_evaluation

ROOT = Path(__file__).resolve().parent.parent
BOT = {"bot": "scripted", "bot_hash": "h1"}


def script():
    spec = importlib.util.spec_from_file_location("seed_groups", ROOT / "analysis" / "seed_groups.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(root: Path, name: str, wins: dict[int, list[int]]) -> str:
    """A run directory whose checkpoint ``v`` was evaluated once per entry of ``wins[v]`` (100 games each, seeds
    0, 1, ...)."""
    path = root / name
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("env:\n  name: moba\n")
    (path / "meta.json").write_text("{}")
    for version, per_seed in wins.items():
        for seed, w in enumerate(per_seed):
            record_evaluation(path / "evaluations.jsonl", version, 100, seed,
                              {"games": 100, "wins": w, "win_rate": w / 100, **BOT})
    return str(path)


def test_groups_are_read_at_their_versions_summarised_and_tested_by_ranks(tmp_path, capsys):
    high = [run(tmp_path, f"a{s}", {50: [10], 80: [60 + s, 62 + s]}) for s in range(3)]  # two evaluation seeds pooled
    low = [run(tmp_path, f"b{s}", {20: [40 + s], 30: [90]}) for s in range(3)]
    mixed = [run(tmp_path, f"c{s}", {80: [w]}) for s, w in enumerate((70, 30, 50))]
    out = tmp_path / "out"
    assert script().main(["--group", "high", "80", *high, "--group", "low", "20", *low,
                          "--group", "mixed", "80", *mixed, "--levels", "0.5", "0.65", "--out", str(out)]) == 0
    text = (out / "groups.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    assert ["high", "a1", "80", "200", "124", "0.620"] == rows[2][:6]  # 61 + 63 of 200, version 80 only
    assert ["low", "b2", "20", "100", "42", "0.420"] == rows[6][:6]  # version 20, not 30's 90
    # means over runs: a 0.62 (0.61, 0.62, 0.63), b 0.41; level 0.65 reached by one mixed run, 0.5 by all of a
    summary = {row[0]: row[1:] for row in rows if len(row) == 9 and row[0] != "group"}
    assert summary == {"high": ["80", "3", "0.620", "0.010", "0.610", "0.630", "3/3", "0/3"],
                       "low": ["20", "3", "0.410", "0.010", "0.400", "0.420", "0/3", "0/3"],
                       "mixed": ["80", "3", "0.500", "0.200", "0.300", "0.700", "2/3", "1/3"]}
    # every high run above every low one: the most extreme of C(6, 3) splits; mixed interleaves (ranks 1, 5, 6 vs
    # 2, 3, 4 for high: 7 of the 20 splits have a rank sum at least 15)
    assert f"direction test: high above low, p = {1 / comb(6, 3):.4f}" in text
    assert f"direction test: high above mixed, p = {7 / 20:.4f}" in text
    assert "direction test: high above low" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["--group", "a", "80"], "needs NAME VERSION RUN"),
    (["--group", "a", "x", "{a0}"], "the version must be an integer"),
    (["--group", "a", "81", "{a0}"], "has no evaluation of version 81"),
    (["--group", "a", "80", "{a0}", "{a0}"], "names a run twice"),
    (["--group", "a", "80", "{a0}", "--group", "a", "80", "{a0}"], "two groups share a name"),
])
def test_bad_requests_are_refused_with_the_reason(tmp_path, capsys, args, says):
    a0 = run(tmp_path, "a0", {80: [60]})
    argv = [arg.format(a0=a0) for arg in args] + ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as stopped:
        script().main(argv)
    assert stopped.value.code == 2
    assert says in capsys.readouterr().err
