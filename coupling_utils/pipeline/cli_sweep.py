"""``coupling-book sweep`` (a notebook's measurements as cluster jobs) and ``coupling-book measure``
(any model, tidy tables): the commands that submit measurement jobs.

coupling-book sweep f02 --profile paper --executor slurm --partition gpu --gpus-per-job 1 --time 4:00:00
coupling-book sweep f02 --profile paper --status        # each task's state (sweep.STATES) and why
coupling-book sweep --status                           # every sweep recorded in the cache
coupling-book measure openai-community/gpt2 ./my-model --k 10 30 --out results/
"""

from __future__ import annotations

import argparse
import functools
import sys

from coupling_utils.analysis.prose_list import listed
from coupling_utils.pipeline.measure_models import DEFAULT_K  # what --k means when it is not given
from coupling_utils.pipeline.sweep import STATES

__all__ = ["add_sweep_commands"]


def _executor_options(p: argparse.ArgumentParser, *, default: str | None) -> None:
    choices = ("local", "slurm") if default else ("none", "local", "slurm")
    p.add_argument(
        "--executor",
        choices=choices,
        default=default or "none",
        help="where the jobs run: local (this machine, --max-parallel at a time; waits for them) or slurm "
        "(job arrays, one per resource class; returns at once)"
        + ("" if default else "; none (default): in this process"),
    )
    p.add_argument("--partition", help="SLURM partition")
    p.add_argument("--account", help="SLURM account")
    p.add_argument(
        "--gpus-per-job", type=int, help="GPUs each job gets (SLURM --gpus-per-node; local: visible GPUs)"
    )
    p.add_argument("--cpus-per-job", type=int, help="CPUs each SLURM job gets")
    p.add_argument(
        "--mem-gb",
        type=float,
        help="host memory each SLURM job gets, in GB (default: sized per model; given, it overrides that)",
    )
    p.add_argument(
        "--time",
        help="time limit per job: minutes, HH:MM:SS or D-HH:MM (default on SLURM: sized per model from "
        "the cost model, else 60 min; given, it overrides that)",
    )
    p.add_argument(
        "--max-parallel",
        type=int,
        help="jobs at once (SLURM: in all, over every array of the sweep; local: default 1, one model on "
        "the device at a time)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would be "
        + ("submitted" if default else "measured or submitted")
        + " (for SLURM, the batch script) and stop: nothing is measured, submitted or recorded",
    )


# the options that only --executor local or slurm reads: (dest, as typed)
_EXECUTOR_OPTIONS = (
    ("partition", "--partition"),
    ("account", "--account"),
    ("gpus_per_job", "--gpus-per-job"),
    ("cpus_per_job", "--cpus-per-job"),
    ("mem_gb", "--mem-gb"),
    ("time", "--time"),
    ("max_parallel", "--max-parallel"),
)


def _resources(args):
    from coupling_utils.pipeline.sweep import Resources

    return Resources(
        executor=args.executor,
        partition=args.partition,
        account=args.account,
        gpus_per_job=args.gpus_per_job,
        cpus_per_job=args.cpus_per_job,
        mem_gb=args.mem_gb,
        time_limit=args.time,
        max_parallel=args.max_parallel,
    )


def _print_states(title: str, states) -> None:
    from coupling_utils.pipeline.sweep_state import summary_line

    print(f"{title}: {summary_line(states)}")
    for s in states:
        print(f"  {s.line()}")
        if s.log and s.state in ("failed", "interrupted"):
            print(f"  {'':<12} log: {s.log}")


# after SIGTERM (``kill``, a time limit): what the sweep did (sweep_submit.sigterm_stops)
TERMINATED = (
    "terminated: stopped on SIGTERM (a time limit, or kill), as on Ctrl-C. What was finished is "
    "stored; rerun the same command to continue."
)


def _stoppable(command):
    """``command`` with SIGTERM stopping it as Ctrl-C does, said as what it was (exit 143), and
    a sweep already being run by another process refused (exit 1)."""

    @functools.wraps(command)
    def run(args) -> int:
        from coupling_utils.pipeline.sweep import SweepBusy
        from coupling_utils.pipeline.sweep_submit import Terminated, sigterm_stops

        try:
            with sigterm_stops():
                return command(args)
        except Terminated:
            print(f"\n{TERMINATED}", file=sys.stderr)
            return 143
        except SweepBusy as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1

    return run


@_stoppable
def _cmd_sweep(args) -> int:
    from coupling_utils.chapters.checks import ParameterError
    from coupling_utils.pipeline.execution import parse_overrides
    from coupling_utils.pipeline.sweep import SweepError, load_sweep, plan_sweep, recorded_sweeps
    from coupling_utils.pipeline.sweep_state import sweep_status
    from coupling_utils.pipeline.sweep_submit import submit

    try:
        if args.status and not args.notebook:
            folders = recorded_sweeps()
            if not folders:
                print("no sweeps recorded in this cache (`coupling-book sweep NOTEBOOK` records one)")
            damaged = 0
            for folder in folders:
                try:
                    sweep = load_sweep(folder)
                except Exception as exc:  # noqa: BLE001 - a damaged record: say which, list the others
                    damaged += 1
                    print(
                        f"error: the sweep record in {folder} cannot be read ({type(exc).__name__}: {exc}); "
                        "remove that folder (rerunning its `coupling-book sweep` records it again)",
                        file=sys.stderr,
                    )
                    continue
                _print_states(
                    f"{sweep.name} ({sweep.notebook}, profile {sweep.profile})", sweep_status(sweep)
                )
            return 1 if damaged else 0
        if not args.notebook:
            print("error: name a notebook (e.g. f02), or pass --status", file=sys.stderr)
            return 2
        resources = None if args.status else _resources(args)  # bad options: refused before planning
        overrides = parse_overrides(args.param)
        sweep = plan_sweep(args.notebook, args.profile, overrides)
        if args.status:
            _print_states(f"{sweep.name} ({sweep.folder})", sweep_status(sweep))
            return 0
        print(f"{sweep.name}: {len(sweep.tasks)} task(s), one per (model, revision); state in {sweep.folder}")
        states = submit(sweep, resources, dry_run=args.dry_run)
    except (ParameterError, SweepError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _print_states(sweep.name, states)
    if args.executor == "local" and not args.dry_run:
        left = [s for s in states if s.state != "done"]
        if left:
            print(
                f"{len(left)} of {len(states)} task(s) not done; rerunning the same command runs only "
                "those (the done ones are kept): for a failed one, fix its reason first"
            )
        return 1 if left else 0
    return 0


@_stoppable
def _cmd_measure(args) -> int:
    from coupling_utils.measurement import Loads
    from coupling_utils.pipeline.measure_models import (
        MeasureError,
        MeasureRun,
        measure_dry_run,
        measure_many,
        measurement_settings,
        read_prompts,
    )
    from coupling_utils.pipeline.sweep import SweepError

    try:
        resources = _measure_resources(args)
        prompts = read_prompts(args.prompts, n=args.n_prompts)
        settings = measurement_settings(
            args.k or DEFAULT_K,
            args.tokens,
            args.method,
            args.max_tokens,
            args.layers,
            args.last_block,
            args.last_block_also,
        )
        loads = Loads(revisions=args.revision or None, dtype=args.dtype)
        run = MeasureRun(
            args.models,
            prompts,
            settings,
            out=args.out,
            loads=loads,
            how=args.how,
            resources=resources,
            prompts_file=args.prompts,
        )
        if args.dry_run:
            print(measure_dry_run(run))
            return 0
        report = measure_many(run)
    except (MeasureError, SweepError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.text())
    if report.bad_input:  # each refusal's paragraph again, on stderr (stdout may be elsewhere)
        for message in dict.fromkeys(report.failures["message"]):
            print(f"error: {message}", file=sys.stderr)
        return 2
    return 0 if report.complete else 1


def _measure_resources(args):
    """``measure``'s executor: None (in this process) or its Resources; an option that only
    ``--executor local`` or ``slurm`` reads, given without one, is refused (it would be ignored)."""
    from coupling_utils.pipeline.sweep import SweepError

    if args.executor != "none":
        return _resources(args)
    given = [typed for dest, typed in _EXECUTOR_OPTIONS if getattr(args, dest) is not None]
    if given:
        raise SweepError(
            f"{listed(given)} only {'apply' if given[1:] else 'applies'} to --executor slurm (or local), and "
            "without --executor this run measures in this process; add --executor slurm (or local), "
            f"or drop {'them' if given[1:] else 'it'}"
        )
    return None


def add_sweep_commands(subparsers) -> None:
    """Add ``sweep`` and ``measure`` to an argparse subparsers object."""
    from coupling_utils.pipeline.execution import add_override_option

    p = subparsers.add_parser(
        "sweep",
        help="run a notebook's measurements as jobs (SLURM job array or this machine), resumable",
        description="Turn the measurements NOTEBOOK needs at --profile into one job per (model, revision), "
        "submitted with submitit; all write into $COUPLING_CACHE, which the notebook then reads. "
        "Resubmitting runs only what is missing.",
    )
    p.add_argument("notebook", nargs="?", help="notebook name or prefix, e.g. f02")
    p.add_argument("--profile", default="paper", help="parameter profile (default: paper)")
    add_override_option(p)
    p.add_argument(
        "--status",
        action="store_true",
        help=f"list each task's state ({' / '.join(STATES)}) and why, and stop",
    )
    _executor_options(p, default="local")
    p.set_defaults(func=_cmd_sweep)
    _add_measure_command(subparsers)


def _measure_settings_options(p: argparse.ArgumentParser) -> None:
    """The options of ``measure`` that make its :class:`~coupling_utils.measurement.Settings`."""
    from coupling_utils.engine.blocks import LAST_BLOCKS
    from coupling_utils.measurement.settings import LAST_BLOCK_MAPS
    from coupling_utils.pipeline.measure_models import HOWS, METHODS

    p.add_argument(
        "--k",
        type=int,
        nargs="+",
        action="extend",
        help="K values (default: 10 30 50); repeatable, they add up",
    )
    p.add_argument("--tokens", default="last", choices=("last", "all"), help="tokens compared across depth")
    p.add_argument("--method", default="exact", choices=METHODS, help="Jacobian SVDs")
    p.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="weights' dtype"
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        help="cut prompts to this many tokens (a prompt longer than the model's context is always cut "
        "to the context, with a notice)",
    )
    p.add_argument(
        "--layers",
        type=int,
        nargs="+",
        action="extend",
        help="blocks to measure, 0-based, negative from the end (at least two: coupling compares "
        "blocks; default: all); repeatable",
    )
    p.add_argument(
        "--last-block",
        default="block",
        choices=LAST_BLOCKS,
        help="what the last block is: 'block' (alone, the paper's definition; default), 'final_norm' "
        "(with the model's final norm, hidden_states[L-1] -> hidden_states[L], as the authors' code "
        "measured it) or 'excluded' (left out)",
    )
    p.add_argument(
        "--last-block-also",
        choices=LAST_BLOCK_MAPS,
        help="measure the last block once more, in the same run, under this other map ('block' or "
        "'final_norm'): one more block, not a second measurement; the tables then hold both maps, told "
        "apart by their last_block column",
    )
    p.add_argument(
        "--how", default="offdiag", choices=HOWS, help="one number per model: offdiag or adjacent pairs"
    )


def _add_measure_command(subparsers) -> None:
    p = subparsers.add_parser(
        "measure",
        help="measure any models (hub ids, local directories, .gguf files) into tidy tables",
        description="Measure the block coupling of MODEL(s) on prompts and write tidy tables (CSV) to --out.",
    )
    p.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="hub id, save_pretrained directory, .gguf file or embedded:NAME",
    )
    p.add_argument(
        "--out", required=True, help="output folder (tables, provenance, and the stored measurements)"
    )
    p.add_argument(
        "--revision",
        action="append",
        metavar="R",
        help="revision(s) of every model, e.g. step1000 (a hub branch or commit; a local folder's "
        "checkpoint in revisions/R/, main the folder itself); repeatable",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help="prompts: .txt (one per line), .csv (columns id, text) or .json (a list or {id: prompt}; "
        "a prompt may be a list of token ids); default: the project's prompt set",
    )
    p.add_argument(
        "--n-prompts",
        type=int,
        default=6,
        help="prompts from the project's set when --prompts is not given (plus the demo prompt)",
    )
    _measure_settings_options(p)
    _executor_options(p, default=None)
    p.set_defaults(func=_cmd_measure)
