"""The GPU benchmark's figures as tables and the scaling curve, from the rows ``python -m hpc_rl.bench gpu
--progress FILE`` appends (one JSON line per finished configuration; several benchmark runs may share the file).

    python analysis/gpu.py docs/figures/gpu_h200.jsonl --out docs/figures

Writes gpu_scaling.png (env steps/s and learner samples/s against env ranks, with linear scaling from the first
point) and gpu_scaling.md, gpu_devices.md, gpu_model.md and gpu_inference.md. Jobs run with extra overrides
(``--set``) are listed in the scaling table and drawn as separate points, outside the curve.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hpc_rl.bench.gpu import efficiency
from hpc_rl.study import Output, fmt, markdown_table, pyplot, run_script


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", type=Path, metavar="ROWS_JSONL", help="files written by --progress")
    p.add_argument("--out", required=True, type=Path, help="directory for the PNG plot and Markdown tables")
    return p


def read_rows(paths: list[Path]) -> dict[str, list[dict]]:
    parts: dict[str, list[dict]] = {}
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not a JSON row: {err}") from err
            parts.setdefault(row.get("part", "?"), []).append(row)
    return parts


def _job_cells(row: dict) -> list:
    return [row["env_ranks"], row.get("inference_ranks", 1), ", ".join(sorted(set(row["devices"]["learner"]))),
            row["lstm_size"], row["precision"], " ".join(row.get("set", [])) or "-", fmt(row["env_steps_per_s"], 0),
            fmt(row["learner_samples_per_s"], 0), fmt(row["inference_batch"], 0), fmt(row["inference_ms"], 2)]


JOB_HEADER = ["env ranks", "inference ranks", "learner device", "LSTM", "precision", "overrides", "env steps/s",
              "learner samples/s", "inference batch", "inference ms"]


def body(args: argparse.Namespace, out: Output) -> None:
    parts = read_rows(args.paths)
    if not parts:
        raise ValueError(f"no rows in {', '.join(map(str, args.paths))}")
    if "devices" in parts:
        out.table("gpu_devices.md", "the default job on CPU cores and on the GPU (steady state)",
                  markdown_table(["job", *JOB_HEADER], [[r["name"], *_job_cells(r)] for r in parts["devices"]]))
    if "model" in parts:
        out.table("gpu_model.md", "the PPO update alone on the GPU",
                  markdown_table(["LSTM", "precision", "parameters", "batch", "samples/s", "vs Honor of Kings"],
                                 [[r["lstm_size"], r["precision"], r["parameters"], r["batch_samples"],
                                   fmt(r["samples_per_s"], 0), fmt(r["vs_honor_of_kings"], 2)]
                                  for r in parts["model"]]))
    if "inference" in parts:
        out.table("gpu_inference.md", "one inference step (observations in, actions out), median",
                  markdown_table(["batch", "LSTM", "device", "pinned", "ms"],
                                 [[r["batch"], r["lstm_size"], r["device"], r["pinned"], fmt(r["step_ms"], 2)]
                                  for r in parts["inference"]]))
    if "scaling" in parts:
        curve = sorted((r for r in parts["scaling"] if not r.get("set")), key=lambda r: r["env_ranks"])
        others = [r for r in parts["scaling"] if r.get("set")]
        if not curve:
            raise ValueError("no scaling row without extra overrides to draw the curve from")
        ranks = [r["env_ranks"] for r in curve]
        rates = {key: [r[key] for r in curve] for key in ("env_steps_per_s", "learner_samples_per_s")}
        effs = {key: efficiency(ranks, values) for key, values in rates.items()}
        plt = pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, key, title in ((axes[0], "env_steps_per_s", "env steps/s"),
                               (axes[1], "learner_samples_per_s", "learner samples/s")):
            ax.plot(ranks, rates[key], "o-", label="measured")
            ax.plot(ranks, [rates[key][0] * n / ranks[0] for n in ranks], "--", color="grey", label="linear")
            for i, r in enumerate(others):
                ax.plot(r["env_ranks"], r[key], "s", color=f"C{i + 1}", label=" ".join(r["set"]))
            ax.set(xlabel="env ranks (1 inference rank, 2 learners, all on the GPU)", ylabel=title, title=title)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        out.figure("gpu_scaling.png", fig)
        rows = [[*_job_cells(r), fmt(effs["env_steps_per_s"][i], 2), fmt(effs["learner_samples_per_s"][i], 2)]
                for i, r in enumerate(curve)]
        rows += [[*_job_cells(r), "-", "-"] for r in others]
        out.table("gpu_scaling.md", "env ranks against throughput, and the efficiency against linear scaling",
                  markdown_table([*JOB_HEADER, "env efficiency", "learner efficiency"], rows))


def main(argv: list[str] | None = None) -> int:
    return run_script(parser(), body, argv)


if __name__ == "__main__":
    sys.exit(main())
