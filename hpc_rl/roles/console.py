"""What a training job prints for its user: the start banner, the progress line, the end-of-run summary.

    start_banner(run_dir, resumed_from, roles, max_versions, max_seconds, stop_hint)   # before the first version
    progress_line(version, elapsed, left, figures)                                    # one per published version
    waiting_line(version, elapsed, figures)                        # before a sitting's first version, now and then
    time_left(elapsed, version, first_version, max_versions, max_seconds)             # the budget's remaining time
    sitting_limit(max_seconds, max_run_seconds, run_seconds_before)                   # this sitting's time limit
    summary_block(summary)                                                             # after the last version

Pure functions of numbers and strings (the controller gathers them), so the wording is tested without a job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def duration(seconds: float) -> str:
    """``m:ss`` under an hour, ``h:mm:ss`` from one hour on."""
    s = max(int(round(seconds)), 0)
    hours, rest = divmod(s, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def rank_ranges(roles: Mapping[int, str]) -> str:
    """``0 controller, 1-2 env, 3 inference, 4-5 learner`` from a rank -> role map (``Topology.role_map``, whose
    roles read ``env[0]``): consecutive ranks of one role are one range."""
    groups: list[tuple[int, int, str]] = []
    for rank in sorted(roles):
        role = roles[rank].split("[")[0]
        if groups and groups[-1][2] == role and groups[-1][1] == rank - 1:
            groups[-1] = (groups[-1][0], rank, role)
        else:
            groups.append((rank, rank, role))
    return ", ".join(f"{a} {role}" if a == b else f"{a}-{b} {role}" for a, b, role in groups)


def sitting_limit(max_seconds: float, max_run_seconds: float, run_seconds_before: float) -> tuple[float, str]:
    """This sitting's wall-time limit in seconds (0: none) and its reason in words: ``pipeline.max_seconds`` (one
    sitting's) or what the run's earlier sittings left of ``pipeline.max_run_seconds``, whichever is shorter.
    A run that has spent its whole budget gets a limit of one second: it stops at its next version."""
    limits = []
    if max_seconds:
        limits.append((max_seconds, f"time limit of {max_seconds:.0f} s"))
    if max_run_seconds:
        left = max(max_run_seconds - run_seconds_before, 1.0)
        limits.append((left, f"the run's time limit of {max_run_seconds:.0f} s ({run_seconds_before:.0f} s in "
                             f"earlier sittings)"))
    return min(limits) if limits else (0.0, "")


def budget(max_versions: int, max_seconds: float) -> str:
    """The run's stopping rule in words (``pipeline.max_versions``, ``pipeline.max_seconds``; 0: no time limit)."""
    if max_seconds:
        return f"version {max_versions} or {duration(max_seconds)} of wall time, whichever comes first"
    return f"version {max_versions}"


def start_banner(run_dir: Path, resumed_from: int, checkpoint: str | None, roles: Mapping[int, str],
                 what: str, max_versions: int, max_seconds: float, stop_hint: str | None) -> str:
    """The lines a job prints before its first version: where the run is, what it resumed from, what runs on which
    rank, its budget, and how to stop and resume it (``stop_hint``; None where no signal is watched)."""
    start = (f"resuming {run_dir} from version {resumed_from} ({checkpoint})" if resumed_from >= 0
             else f"new run in {run_dir}")
    lines = [f"hpc_rl: {what}; {start}",
             f"  ranks: {rank_ranges(roles)}",
             f"  budget: until {budget(max_versions, max_seconds)}"]
    if stop_hint:
        lines.append(f"  stop: {stop_hint}")
    return "\n".join(lines)


def time_left(elapsed: float, version: int, first_version: int, max_versions: int, max_seconds: float
              ) -> float | None:
    """Seconds until the budget ends the run, whichever limit comes first: the time limit (``max_seconds``, 0 for
    none) or ``max_versions`` at this attempt's pace so far (versions since ``first_version`` over ``elapsed``).
    None when neither is known yet (no version published and no time limit)."""
    estimates = []
    if max_seconds:
        estimates.append(max_seconds - elapsed)
    done = version - first_version
    if done > 0 and elapsed > 0:
        estimates.append((max_versions - version) * elapsed / done)
    return max(min(estimates), 0.0) if estimates else None


def win_figure(wins: int, games: int, low: float, high: float) -> str:
    """A win rate with its 95% interval and game count, or n/a before any game."""
    return f"{wins / games:.2f} [{low:.2f},{high:.2f}] n={games}" if games else "n/a"


def progress_line(version: int, elapsed: float, left: float | None, figures: Sequence[tuple[str, str]]) -> str:
    """``v   12  1:04 elapsed, ~8:56 left  env 2108 steps/s  ...``: the version first (what scripts grep for), then
    the clock, then the (name, value) figures that fit the run's environment, in order."""
    clock = f"{duration(elapsed)} elapsed" + (f", ~{duration(left)} left" if left is not None else "")
    return "  ".join([f"v{version:5d}", clock, *(f"{name} {value}" for name, value in figures)])


def waiting_line(version: int, elapsed: float, figures: Sequence[tuple[str, str]]) -> str:
    """``waiting for version 1  0:30 elapsed  env 130 steps/s  ...``: what a sitting has played while its first update
    is still to come (no ``v`` first: scripts that read progress lines do not take it for one)."""
    return "  ".join([f"waiting for version {version + 1}", f"{duration(elapsed)} elapsed",
                      *(f"{name} {value}" for name, value in figures)])


def _ratio(final: Mapping, key: str) -> str:
    """``4.75x [4.21, 5.36]``: a ratio of the final evaluation and its 95% interval (``<key>_ci95``; evaluations
    written before it had one show the ratio alone)."""
    interval = final.get(f"{key}_ci95")
    return f"{final[key]:.2f}x" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def final_eval_line(final: Mapping | None) -> str:
    """The final evaluation in one line (``final_eval`` of summary.json; None: not run)."""
    if final is None:
        return "none"
    if "win_rate" in final:
        low, high = final["ci95"]
        return (f"win rate {final['win_rate']:.2f} [{low:.2f}, {high:.2f}] over {final['games']} games vs "
                f"{final['bot']} (both sides, draws lose), {final['seconds']:.0f} s")
    if "lifetime_ratio" in final:
        (p_low, p_high), (r_low, r_high) = final["policy_ci95"], final["random_ci95"]
        populations = [final[f"population_{k}_mean_lifetime"] for k in range(len(final))
                       if f"population_{k}_mean_lifetime" in final]
        each = f" (populations: {', '.join(f'{m:.1f}' for m in populations)})" if populations else ""
        return (f"mean lifetime {final['policy_mean_lifetime']:.1f} [{p_low:.1f}, {p_high:.1f}]{each} vs random "
                f"{final['random_mean_lifetime']:.1f} [{r_low:.1f}, {r_high:.1f}] "
                f"({_ratio(final, 'lifetime_ratio')}) over the first {final['policy_agents']} agents of "
                f"{final['worlds']} worlds"
                + (f"; head to head in the same worlds {final['head_to_head_policy_mean_lifetime']:.1f} vs "
                   f"{final['head_to_head_random_mean_lifetime']:.1f} ({_ratio(final, 'head_to_head_ratio')})"
                   if "head_to_head_ratio" in final else "") + f", {final['seconds']:.0f} s")
    return (f"mean greedy return {final['mean_return']:.1f} (std {final['std_return']:.1f}) over "
            f"{final['episodes']} episodes, {final['seconds']:.0f} s")


ENDINGS = {"finished": "finished", "time_limit": "stopped by its time limit",
           "preempted": "stopped by a preemption signal (USR2)",
           "cancelled": "stopped by a signal (TERM, or USR1: Ctrl-C)"}


def summary_block(summary: Mapping) -> str:
    """The lines a job prints at its end, from the content of summary.json."""
    ending = ENDINGS.get(summary["state"], summary["state"])
    lines = [f"== run {summary['run_name']} {ending} at version {summary['version']} after "
             f"{duration(summary['seconds'])} ==",
             f"final evaluation: {final_eval_line(summary['final_eval'])}"]
    if summary.get("final_eval_note"):
        lines.append(f"  ({summary['final_eval_note']})")
    width = max(len(name) for name in summary["files"])
    lines.append("files:")
    lines += [f"  {name:<{width}}  {path}" for name, path in summary["files"].items()]
    lines.append("next:")
    lines += [f"  {command}" for command in summary["next"]]
    return "\n".join(lines)
