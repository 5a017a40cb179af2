"""`make reproduce`'s sweeps: OpenAI Five's Figure 5 panels and the Neural MMO sweeps as Hydra multiruns on Slurm,
resumable across sittings.

    python -m hpc_rl.reproduce --runs runs/figure5                        # every Figure 5 panel, one member at a time
    python -m hpc_rl.reproduce --runs runs/figure5 --panels staleness --seeds 3 4 --parallel 2 --versions 100
    python -m hpc_rl.reproduce --runs runs/figure5 --dry-run              # what is finished, what would run
    python -m hpc_rl.reproduce --runs runs/figure5 --launcher local --parallel 2   # one node, no Slurm: mpirun
    python -m hpc_rl.reproduce --runs runs --panels nmmo_populations --launcher local   # docs/nmmo.md

A panel is an ablation (``conf/ablation/<panel>.yaml``: the swept key, its values and the default seeds) run on
``conf/experiment/<experiment>.yaml`` (``figure5`` for Figure 5's panels, ``nmmo`` for Neural MMO's) into
``<runs>/<panel>/``. Each member is one Slurm array task = one MPI job (``jobs/train.py`` through the submitit
launcher ``hydra/launcher=local_slurm``) of as many ranks as its composed config's topology; its run directory is
named after its value and seed by the ablation config, so a member keeps its directory from one sitting to the next.

A member's budget is its config's: ``pipeline.max_versions`` (``--versions`` for Figure 5's panels), or, where the
ablation sets ``pipeline.max_run_seconds`` (Neural MMO's: equal time, not equal versions), that much wall time over
all the member's sittings. Before launching, every member whose run directory has a ``summary.json`` that ends its
budget is skipped: state ``finished`` at the panel's versions or more, or ``time_limit`` with ``run_seconds`` at the
panel's seconds or more. One that started and did not end its budget (a crash, a cancelled job, a sitting's own
time limit) is launched again and resumes from its latest checkpoint. The rest run as few multiruns as cover them
exactly (one per set of values sharing the same pending seeds), ``--parallel`` members at once. While a multirun
runs, a line says which members are running and how many of the whole reproduction remain.

Stopping: SIGINT (Ctrl-C), SIGTERM or SIGHUP to the driver ends its multirun and cancels the Slurm jobs it
submitted (a member commits a checkpoint when cancelled and resumes from it at the next sitting). A driver killed
outright (SIGKILL) cannot do that; the next one finds the earlier sitting's jobs still queued or running and refuses
to launch their members a second time, naming the jobs.

Without Slurm (``--launcher local``: a workstation, or a GPU node reached without a scheduler), every member is its
own ``python -m hpc_rl.launch RANKS jobs/train.py ablation=<panel> ...`` (mpirun), ``--parallel`` at a time, with the
same run directories, the same skipping of finished members and the same progress lines; its output goes to
``<runs>/<panel>/logs/<value>-seed<seed>.log``. Members run seed by seed (every panel's values for one seed, then
the next seed), so a sitting cut short leaves each value with about as many seeds as the others. A stop signal is passed on to
every running member (its ranks commit a checkpoint and end ``cancelled``), and the next sitting resumes them.

Versions: ``--versions`` for the staleness and reuse members, ``--batch-versions`` (default half as many) for the
batch-size members. A version of a batch k times larger costs k times the env steps, and larger batches need fewer
versions (what Figure 5a measures), so the batch panel's budget is cut to keep its cost near the other two panels'
(its baseline, 2 segments, reaches the thresholds in fewer versions than the 1-segment members of the others).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from hpc_rl.slurm import active_jobs, cancel, submitted_jobs
from hpc_rl.storage.layout import RunLayout

ROOT = Path(__file__).resolve().parent.parent
PANELS = ("batch_size", "staleness", "reuse")  # Figure 5a, 5b, 5c
NMMO_PANELS = ("nmmo_populations", "nmmo_agents")  # docs/nmmo.md, "Sweeps"
EXPERIMENTS = {**dict.fromkeys(PANELS, "figure5"), **dict.fromkeys(NMMO_PANELS, "nmmo")}  # each panel's preset
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class Panel:
    """One ablation: the config key it sweeps, the values, the seeds of every value and each member's versions."""

    name: str
    key: str
    values: tuple[str, ...]
    seeds: tuple[str, ...]
    versions: int = 0  # pipeline.max_versions of every member (0: not chosen yet)
    seconds: float = 0.0  # pipeline.max_run_seconds of every member (0: none; the versions are the budget)
    ranks: int = 0  # MPI ranks of every member: its topology's world size (0: not chosen yet)
    # What the ablation config sets for all its members besides the swept key (dotted key -> value), e.g. the reuse
    # panel's learning rate: a finished run directory counts as a member only if it has these too.
    settings: tuple[tuple[str, object], ...] = ()

    @property
    def members(self) -> list[tuple[str, str]]:
        return [(v, s) for v in self.values for s in self.seeds]

    @property
    def budget(self) -> str:
        """Each member's budget in words."""
        return f"{self.seconds:.0f} s of training each" if self.seconds else f"{self.versions} versions"


def read_panel(name: str, conf: Path = ROOT / "conf") -> Panel:
    """The panel of ``conf/ablation/<name>.yaml``: its sweeper params are the swept key and ``seed``."""
    path = conf / "ablation" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"no ablation {name!r}: {path} does not exist")
    ablation = yaml.safe_load(path.read_text())
    params = dict(ablation["hydra"]["sweeper"]["params"])
    seeds = params.pop("seed", None)
    if seeds is None or len(params) != 1:
        raise ValueError(f"{path}: the sweeper must sweep seed and one other key, got {sorted(params) + ['seed']}")
    ((key, values),) = params.items()
    fixed = {k: v for k, v in ablation.items() if k not in ("hydra", "defaults", "runs_dir", "run_name")}
    return Panel(name, key, _split(values), _split(seeds), settings=tuple(sorted(_leaves(fixed).items())))


def _leaves(node: dict, prefix: str = "") -> dict[str, object]:
    """``{"ppo": {"lr": {"start": 3e-3}}}`` as ``{"ppo.lr.start": 3e-3}``."""
    out = {}
    for k, v in node.items():
        out.update(_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _get(config: dict, key: str):
    """The value at dotted ``key`` in a run's config.yaml, or None."""
    node = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _split(values) -> tuple[str, ...]:
    return tuple(str(v).strip() for v in str(values).split(","))


def same_value(a: str, b) -> bool:
    """``a`` (as written on a command line) and ``b`` (as a run's config.yaml holds it) are the same value."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def is_finished(summary: dict | None, versions: int, seconds: float = 0.0) -> bool:
    """A member is done when its job ended with state ``finished`` having trained ``versions`` or more, or, with a
    run time budget of ``seconds``, with state ``time_limit`` after ``run_seconds`` of that or more (a member stopped
    by a signal or its sitting's own time limit, or one run shorter, trains on when launched again)."""
    if not summary:
        return False
    if summary.get("state") == "finished":
        return int(summary.get("version") or 0) >= versions
    return bool(seconds) and summary.get("state") == "time_limit" and float(summary.get("run_seconds") or 0) >= seconds


def finished_members(panel: Panel, sweep_dir: Path) -> set[tuple[str, str]]:
    """The (value, seed) of ``panel`` whose run directory under ``sweep_dir`` holds a summary finished at the
    panel's versions, read from each directory's own config.yaml (so the names are the ablation config's business
    alone). A run that differs from the panel's own settings (one left by an earlier version of the ablation config,
    say another learning rate) is not one of its members."""
    done = set()
    for run_dir in sorted(p for p in sweep_dir.glob("*") if p.is_dir()):
        layout = RunLayout(run_dir)
        if not (layout.summary.is_file() and layout.config.is_file()):
            continue
        if not is_finished(json.loads(layout.summary.read_text()), panel.versions, panel.seconds):
            continue
        config = yaml.safe_load(layout.config.read_text())
        if not all(same_value(str(want), _get(config, key)) for key, want in panel.settings):
            continue
        value = _get(config, panel.key)
        done |= {(v, s) for v, s in panel.members if same_value(v, value) and same_value(s, config.get("seed"))}
    return done


def launch_groups(pending: Iterable[tuple[str, str]]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """The fewest (values, seeds) products, grouped by shared pending seeds, whose union is exactly ``pending``:
    one Hydra multirun each. A fresh panel is one product; one cut short needs a second for its remaining seeds."""
    seeds_of: dict[str, list[str]] = {}
    for value, seed in pending:
        seeds_of.setdefault(value, []).append(seed)
    groups: dict[tuple[str, ...], list[str]] = {}
    for value, seeds in seeds_of.items():
        groups.setdefault(tuple(seeds), []).append(value)
    return [(tuple(values), seeds) for seeds, values in groups.items()]


def multirun_command(python: str, panel: Panel, values: Sequence[str], seeds: Sequence[str], args) -> list[str]:
    preset = [f"experiment={args.experiment}"] if args.experiment else []  # none: conf/train.yaml's own settings
    return [python, str(ROOT / "jobs" / "train.py"), "-m", f"ablation={panel.name}", *preset,
            "hydra/launcher=local_slurm", f"hydra.launcher.tasks_per_node={panel.ranks}",
            f"hydra.launcher.array_parallelism={args.parallel}", f"hydra.sweep.dir={args.runs / panel.name}",
            f"pipeline.max_versions={panel.versions}", f"{panel.key}={','.join(values)}", f"seed={','.join(seeds)}",
            *args.overrides]


def member_command(python: str, panel: Panel, value: str, seed: str, args) -> list[str]:
    """One member as its own MPI job on this node (``--launcher local``): the ablation config names its run
    directory, as in a multirun; ``runs_dir`` replaces the multirun's sweep directory."""
    preset = [f"experiment={args.experiment}"] if args.experiment else []
    return [python, "-m", "hpc_rl.launch", str(panel.ranks), str(ROOT / "jobs" / "train.py"), f"ablation={panel.name}",
            *preset, f"runs_dir={args.runs / panel.name}", f"pipeline.max_versions={panel.versions}",
            f"{panel.key}={value}", f"seed={seed}", *args.overrides]


def local_order(panels: Sequence[Panel], done: dict[str, set]) -> list[tuple[Panel, str, str]]:
    """The pending members of ``panels`` seed by seed (every panel's values for one seed, then the next seed): a
    sitting cut short leaves every value of every panel with about as many finished seeds as the others, which is
    what a comparison of values needs."""
    pending = [(p, v, s) for p in panels for v, s in p.members if (v, s) not in done[p.name]]
    return sorted(pending, key=lambda m: (m[0].seeds.index(m[2]), panels.index(m[0]), m[0].values.index(m[1])))


def running_members(sweep_dir: Path, panel: Panel) -> list[str]:
    """Run directories that have started (a metrics.h5) and not ended their budget."""
    running = []
    for run_dir in sorted(p for p in sweep_dir.glob("*") if p.is_dir() and RunLayout(p).metrics.is_file()):
        summary = RunLayout(run_dir).summary
        if not (summary.is_file() and is_finished(json.loads(summary.read_text()), panel.versions, panel.seconds)):
            running.append(run_dir.name)
    return running


def watch(process: subprocess.Popen, panel: Panel, sweep_dir: Path, done_elsewhere: int, total: int,
          poll_s: float = 10.0) -> int:
    """Wait for a multirun, printing a line whenever the panel's finished or running members change."""
    last = None
    while True:
        code = process.poll()
        finished = len(finished_members(panel, sweep_dir))
        running = running_members(sweep_dir, panel)
        line = (f"[{time.strftime('%H:%M:%S')}] {panel.name}: {finished}/{len(panel.members)} finished; "
                f"running {', '.join(running) or '(none)'}; "
                f"{total - done_elsewhere - finished} of {total} members remain in all")
        if (finished, running) != last:
            print(line, flush=True)
            last = (finished, running)
        if code is not None:
            return code
        try:  # returns as soon as the multirun ends, not at the next poll
            process.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass


class Stopped(Exception):
    """The driver was told to stop by a signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame):
    raise Stopped(signum)


def stop_multirun(process: subprocess.Popen, submitit_dir: Path, earlier: set[str], grace_s: float = 30.0) -> list[str]:
    """End a multirun and cancel the jobs it submitted (their folders in ``submitit_dir`` not in ``earlier``);
    returns the cancelled job ids. The multirun goes first, so it submits nothing after the folders are read."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    jobs = submitted_jobs(submitit_dir, earlier)
    cancel(jobs)
    return jobs


def add_launcher_argument(p: argparse.ArgumentParser) -> None:
    """``--launcher``, for every driver whose members ``launch`` runs (Figure 5's and Figure 6's)."""
    p.add_argument("--launcher", choices=("slurm", "local"), default="slurm",
                   help="slurm: Hydra multiruns through submitit onto Slurm; local: each member an mpirun job on "
                   "this node (no scheduler)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=Path, required=True, help="one sweep directory per panel is made under it")
    p.add_argument("--panels", nargs="+", default=list(PANELS), choices=PANELS + NMMO_PANELS,
                   help="Figure 5's (the default: all three) or Neural MMO's, not both at once")
    p.add_argument("--experiment", help="the members' preset, conf/experiment/<name>.yaml (default: figure5 for "
                   "Figure 5's panels, nmmo for Neural MMO's)")
    p.add_argument("--seeds", nargs="+", help="seeds of every value (default: the ablation config's)")
    p.add_argument("--values", nargs="+", help="the swept values to run, some of the ablation config's (default: "
                   "all); one panel only. A direction test compares the baseline with the value farthest from it, "
                   "so a replication of that test may run those two alone")
    p.add_argument("--versions", type=int, help="pipeline.max_versions of the staleness and reuse members "
                   "(default: the preset's, 250 for figure5)")
    p.add_argument("--batch-versions", type=int, help="pipeline.max_versions of the batch-size members (default: "
                   "half of --versions)")
    p.add_argument("--parallel", type=int, default=1, help="members running at once (Slurm array parallelism)")
    add_launcher_argument(p)
    p.add_argument("--ranks", type=int, help="MPI ranks per member (default: the world size of its composed "
                   "config's topology); a member whose topology needs another number is refused at its start")
    p.add_argument("--dry-run", action="store_true", help="print the multiruns, launch nothing")
    p.add_argument("overrides", nargs="*", help="further config overrides for every member (key=value)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.runs = args.runs.resolve()  # the multiruns run in the checkout's root
    if any(n is not None and n < 1 for n in (args.parallel, args.versions, args.batch_versions, args.ranks)):
        raise SystemExit("--parallel, --versions, --batch-versions and --ranks must be >= 1")
    presets = {EXPERIMENTS[name] for name in args.panels}
    if len(presets) > 1:
        raise SystemExit(f"--panels {' '.join(args.panels)}: Figure 5's panels and Neural MMO's train different "
                         f"presets; run them in two sweeps")
    args.experiment = args.experiment or presets.pop()
    if args.values and len(args.panels) != 1:
        raise SystemExit(f"--values picks values of one panel's key; name one panel, got {' '.join(args.panels)}")
    panels = []
    for name in args.panels:
        panel = read_panel(name)
        if args.values:
            unknown = [v for v in args.values if not any(same_value(v, w) for w in panel.values)]
            if unknown:
                raise SystemExit(f"--values {' '.join(unknown)}: not among the {name} panel's values "
                                 f"{', '.join(panel.values)} (conf/ablation/{name}.yaml)")
            panel = replace(panel, values=tuple(w for w in panel.values if any(same_value(v, w) for v in args.values)))
        # An override of a setting the ablation config fixes wins on every member, so it is what a member has.
        given = dict(o.lstrip("+").split("=", 1) for o in args.overrides if "=" in o)
        settings = tuple((k, given.get(k, v)) for k, v in panel.settings)
        member = member_config(panel, args.experiment, args.overrides)
        versions = args.versions or member.pipeline.max_versions
        if name == "batch_size":
            versions = args.batch_versions or max(1, versions // 2)
        panels.append(replace(panel, seeds=tuple(args.seeds) if args.seeds else panel.seeds, settings=settings,
                              versions=versions, seconds=member.pipeline.max_run_seconds,
                              ranks=args.ranks or member.topology.world_size))
    done = {p.name: finished_members(p, args.runs / p.name) for p in panels}
    total = sum(len(p.members) for p in panels)
    skipped = sum(len(d) for d in done.values())
    print(f"{total} members in {len(panels)} panel(s): {skipped} finished (skipped), {total - skipped} to run, "
          f"{args.parallel} at a time", flush=True)
    return launch(panels, done, total, args)


def member_config(panel: Panel, experiment: str | None, overrides: Sequence[str]):
    """The config of ``panel``'s first member (``hpc_rl.config.TrainConfig``), composed as its job will compose it:
    its budget and topology are every member's."""
    from hpc_rl.config import compose_config

    preset = [f"experiment={experiment}"] if experiment else []
    member = [f"ablation={panel.name}", *preset, "runs_dir=.", f"{panel.key}={panel.values[0]}",
              f"seed={panel.seeds[0]}", *overrides]
    try:
        return compose_config(member)
    except Exception as err:  # noqa: BLE001 - Hydra's errors have no common base
        raise SystemExit(f"the {panel.name} members' config does not compose ({' '.join(member)}): {err}") from None


def launch(panels: list[Panel], done: dict[str, set], total: int, args) -> int:
    """Run the pending members of ``panels`` (``run_panels``), refusing to while jobs of an earlier sitting are still
    in Slurm, and ending the sitting cleanly on a stop signal."""
    if not args.dry_run and args.launcher == "slurm":
        for panel in panels:  # a sitting ended by SIGKILL leaves its jobs behind: they would run members twice
            earlier = active_jobs(submitted_jobs(args.runs / panel.name / ".submitit"))
            if earlier:
                raise SystemExit(f"Slurm jobs of an earlier sitting are still queued or running in {panel.name}: "
                                 f"{' '.join(earlier)}. Wait for them or cancel them (scancel {' '.join(earlier)}), "
                                 f"then run again.")
    handlers = {signum: signal.signal(signum, _stop) for signum in STOP_SIGNALS}
    try:
        run = run_panels if args.launcher == "slurm" else run_panels_locally
        return run(panels, done, total, args)
    except Stopped as stop:  # between multiruns: nothing of this sitting is in Slurm
        print(f"stopped by {stop}; run again to resume", file=sys.stderr, flush=True)
        return 128 + stop.signum
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def run_panels(panels: list[Panel], done: dict[str, set], total: int, args) -> int:
    """Launch the pending members panel by panel; the exit code of the first multirun that failed, else 0."""
    for panel in panels:
        sweep_dir = args.runs / panel.name
        pending = [m for m in panel.members if m not in done[panel.name]]
        print(f"== {panel.name} ({panel.key}, {panel.budget}): {len(panel.members) - len(pending)}/"
              f"{len(panel.members)} finished, {len(pending)} to run", flush=True)
        done_elsewhere = sum(len(d) for name, d in done.items() if name != panel.name)
        for values, seeds in launch_groups(pending):
            command = multirun_command(sys.executable, panel, values, seeds, args)
            print("$ " + " ".join(command), flush=True)
            if args.dry_run:
                continue
            sweep_dir.mkdir(parents=True, exist_ok=True)
            submitit_dir = sweep_dir / ".submitit"
            earlier = {p.name for p in submitit_dir.iterdir()} if submitit_dir.is_dir() else set()
            # Hydra's and submitit's output (a line per status poll) goes to a log; the progress lines stay readable.
            log = sweep_dir / "multirun.log"
            with open(log, "a") as out, subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT) \
                    as process:
                try:
                    code = watch(process, panel, sweep_dir, done_elsewhere, total)
                except Stopped as stop:
                    for signum in STOP_SIGNALS:  # a second Ctrl-C must not interrupt the cleanup
                        signal.signal(signum, signal.SIG_IGN)
                    jobs = stop_multirun(process, submitit_dir, earlier)
                    print(f"stopped by {stop}: ended the {panel.name} multirun and cancelled its Slurm jobs "
                          f"({' '.join(jobs) or 'none submitted yet'}); run again to resume", file=sys.stderr,
                          flush=True)
                    return 128 + stop.signum
            if code != 0:
                print(f"the {panel.name} multirun failed (exit {code}, output in {log}); run again to resume",
                      file=sys.stderr)
                return code
        done[panel.name] = finished_members(panel, sweep_dir)
    return 0


def run_panels_locally(panels: list[Panel], done: dict[str, set], total: int, args, poll_s: float = 2.0) -> int:
    """``--launcher local``: the pending members of ``panels``, each its own mpirun job, ``--parallel`` at once.
    Every member runs even when another fails; the exit code is the first failed member's, else 0."""
    for panel in panels:
        print(f"== {panel.name} ({panel.key}, {panel.budget}): {len(done[panel.name])}/"
              f"{len(panel.members)} finished, {len(panel.members) - len(done[panel.name])} to run", flush=True)
    queue = []
    for panel, value, seed in local_order(panels, done):
        command = member_command(sys.executable, panel, value, seed, args)
        print("$ " + " ".join(command), flush=True)
        queue.append((panel, value, seed, command))
    if args.dry_run:
        return 0
    running: dict[subprocess.Popen, tuple[Panel, str, str, Path]] = {}
    failed: list[tuple[str, int, Path]] = []
    last = None
    try:
        while queue or running:
            for process in [p for p in running if p.poll() is not None]:
                panel, value, seed, log = running.pop(process)
                if process.returncode != 0:
                    failed.append((f"{panel.name} {panel.key}={value} seed={seed}", process.returncode, log))
                    print(f"{panel.name}: {panel.key}={value} seed={seed} failed (exit {process.returncode}, output "
                          f"in {log})", file=sys.stderr, flush=True)
            while queue and len(running) < args.parallel:
                panel, value, seed, command = queue.pop(0)
                log = args.runs / panel.name / "logs" / f"{value}-seed{seed}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "a") as out:  # the child holds its own descriptor
                    process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL)
                running[process] = (panel, value, seed, log)
            finished = sum(len(finished_members(p, args.runs / p.name)) for p in panels)
            names = sorted(f"{p.name}/{v}-seed{s}" for p, v, s, _ in running.values())
            if (finished, names) != last:
                print(f"[{time.strftime('%H:%M:%S')}] {finished - sum(len(d) for d in done.values())} finished in "
                      f"this sitting; running {', '.join(names) or '(none)'}; {total - finished} of {total} members "
                      f"remain in all", flush=True)
                last = (finished, names)
            if running:
                time.sleep(poll_s)
    except Stopped:
        for signum in STOP_SIGNALS:  # a second Ctrl-C must not interrupt the cleanup
            signal.signal(signum, signal.SIG_IGN)
        stopped = stop_members(list(running))
        print(f"stopping: passed the stop on to {stopped} running member(s); run again to resume", file=sys.stderr,
              flush=True)
        raise
    for name, code, log in failed:
        print(f"failed: {name} (exit {code}, output in {log}); run again to resume it", file=sys.stderr)
    return failed[0][1] if failed else 0


def stop_members(processes: list[subprocess.Popen], grace_s: float = 60.0) -> int:
    """Stop local members as Ctrl-C stops ``hpc_rl.launch``: a SIGINT, which it passes to the ranks as a stop at
    their next version (a committed checkpoint, state ``cancelled``); killed if they are not done within
    ``grace_s``. Returns how many were running."""
    import psutil

    # Taken before any signal: mpirun runs in a session of its own (hpc_rl.launch), so a launcher that dies does not
    # take it along, and a member killed after the grace must be killed with its mpirun and ranks.
    trees = {}
    for process in processes:
        try:
            trees[process] = psutil.Process(process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            trees[process] = []
        process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for child in trees[process]:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            process.kill()
            process.wait()
    return len(processes)


if __name__ == "__main__":
    sys.exit(main())
