"""``ucf.tune``: search a statement's schedules with Optuna, in this process, in worker
processes, or on a Dask cluster.

A study lives in one SQLite file in the kernel cache directory, named after
what the schedule is tuned for (statement, formats, dtypes, target and the
inputs' shape class), so calling ``tune`` again resumes it: earlier trials
inform the sampler and the new ones are added. The first trial of a new
study is ucf's default schedule (and, formats searched, the next ones are its
default in each blocked or fixed-width format offered), and the best few found are timed
again in turns with the default before one is returned (``ucf.tuning.final``), so it is
never slower. The best schedule
is recorded in ``ucf.exec.tuned`` for ``schedule="tuned"``. Studies are kept as
``ucf.tuning.study_storage`` says; trials beyond this process run in
``ucf.tuning.parallel_trials``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ucf.errors import ConversionWarning, UcfError, UnsupportedError, boundary
from ucf.exec import tuned
from ucf.format.format import Format, parse_formats
from ucf.format.interop import as_tensor
from ucf.format.tensor import Tensor
from ucf.lang.ast import accesses, statement_orders
from ucf.lang.parser import parse_statement
from ucf.schedule.candidates import passing
from ucf.schedule.text import as_commands
from ucf.tuning import final, format_space, probe, search_problem, space
from ucf.tuning.deps import need
from ucf.tuning.measure import Objective, comparable, spelled_formats
from ucf.tuning.parallel_trials import Progress, in_processes, on_dask
from ucf.tuning.result import Tuned
from ucf.tuning.study_storage import default_storage, open_storage, sampler, study_name
from ucf.tuning.sweep import every_schedule

#: The share of a new study's trials that may go to seed schedules.
SEED_SHARE = 0.25


@boundary
def tune(
    expr: str,
    formats: dict[str, Any] | None = None,
    trials: int = 50,
    n_jobs: int = 1,
    client: Any = None,
    storage: Any = None,
    seed: int | None = None,
    timeout: float | None = None,
    target: str = "llvm",
    dtype: Any = None,
    index_dtype: Any = None,
    shapes: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    search_formats: bool = False,
    exhaustive: bool = False,
    **operands: Any,
) -> Tuned:
    """Search schedules of ``expr`` for the given operands and return the fastest.

    ``trials`` more trials are added to the study (a TPE sampler, seeded with
    ``seed``), in this process, in ``n_jobs`` worker processes, or as tasks on
    the Dask ``client``'s cluster; ``timeout`` (seconds) stops each worker
    early. ``storage`` is an Optuna storage or URL replacing the SQLite file in
    the cache directory. ``dtype`` and ``index_dtype`` default to the operands'
    (as in ``ucf.einsum``); ``shapes`` gives extents the operands do not fix.
    ``progress`` shows a progress bar (default: when stderr is a terminal).
    ``search_formats`` also tries other formats for the sparse inputs (the time of
    converting them is reported apart, as ``Tuned.conversion_time``). ``exhaustive``
    tries every schedule of the space once instead of sampling (a study of its own),
    and refuses a space of more than ``trials`` schedules: the measure of what a
    sampled study found.
    """
    optuna = need("optuna")
    if target == "cuda":
        raise UnsupportedError("tune searches CPU schedules; target 'cuda' is not tuned yet")
    if trials < 1 or n_jobs < 1:
        raise UcfError(f"tune needs trials >= 1 and n_jobs >= 1, got {trials} and {n_jobs}")
    if n_jobs > 1 and client is None and not isinstance(storage, (str, type(None))):
        raise UcfError("tune with n_jobs > 1 needs a storage URL that worker processes can open")
    if exhaustive and search_formats:
        raise UcfError("tune(exhaustive=True) sweeps the schedules of the given formats only")
    fmts, tensors, dtype, index_dtype = _operands(expr, formats, operands, dtype, index_dtype)
    shapes = dict(shapes) if shapes else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionWarning)
        objective = _objective(
            expr, fmts, target, dtype, index_dtype, tensors, shapes, search_formats
        )
        key = tuned.make_key(expr, fmts, dtype, index_dtype, target, _shape(expr, tensors, shapes))
        sweep = None
        if exhaustive:
            sweep = _sweep(objective, trials)
            key, trials = {**key, "exhaustive": True}, len(sweep)
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            study = _run(
                optuna,
                objective,
                key,
                trials,
                n_jobs,
                client,
                storage,
                seed,
                timeout,
                progress,
                sweep,
            )
        finally:
            optuna.logging.set_verbosity(verbosity)
            objective.close()
        result = _result(study, objective)
    if not result.is_default:  # recorded for the formats it was found for, and
        # the shape class of the operands in them (a blocked format stores more entries)
        stored = objective.variant(result.formats).operands
        shape = _shape(expr, stored, shapes)
        best = tuned.make_key(expr, result.formats, dtype, index_dtype, target, shape)
        tuned.record(best, result.schedule, result.time)
    return result


def _operands(expr, formats, operands, dtype, index_dtype):
    """Formats (given, else the operands' own), the operands stored in them with one
    value and index dtype (so no trial times a conversion), and those dtypes. The
    formats given are parsed here, where ``tune`` takes them: the study works with
    ``Format`` objects."""
    fmts = parse_formats(formats, statement_orders(parse_statement(expr)))
    given = {n: as_tensor(v, format=fmts.get(n), name=n) for n, v in operands.items()}
    fmts.update({n: t.format for n, t in given.items()})
    if dtype is None:
        dtype = np.result_type(*(t.dtype for t in given.values()))
    if index_dtype is None:
        wide = any(t.index_dtype == np.int64 for t in given.values())
        index_dtype = np.int64 if wide else np.int32
    dtype, index_dtype = str(np.dtype(dtype)), str(np.dtype(index_dtype))
    tensors = {n: t.convert(index_dtype=index_dtype, dtype=dtype) for n, t in given.items()}
    return fmts, tensors, dtype, index_dtype


def _sizes(expr: str, tensors: dict[str, Tensor], shapes) -> tuple[dict[str, int], dict[str, int]]:
    """The extents of the index variables and the sparse operands' nonzero counts."""
    from ucf.cin.extents import infer

    stmt = parse_statement(expr)
    known = {k: int(v) for k, v in (shapes or {}).items() if not isinstance(v, (tuple, list))}
    sizes = {
        (a.tensor, m): tensors[a.tensor].shape[m]
        for a in accesses(stmt.rhs)
        for m in range(len(a.indices))
    }
    for a in accesses(stmt.rhs):
        for m, idx in enumerate(a.indices):
            if idx.single_variable is not None:
                known.setdefault(idx.single_variable, tensors[a.tensor].shape[m])
    extents = dict(known)
    extents.update({v: n for v, (n, _) in infer(stmt, known, sizes).items() if isinstance(n, int)})
    nnz = {n: t.nnz for n, t in tensors.items() if not t.format.is_dense}
    return extents, nnz


def _shape(expr: str, tensors: dict[str, Tensor], shapes) -> str:
    """The shape class of ``tensors`` (what ``schedule="tuned"`` looks a plan up by)."""
    return tuned.shape_class(*_sizes(expr, tensors, shapes))


def _objective(expr, fmts, target, dtype, index_dtype, tensors, shapes, search) -> Objective:
    """The trial function, with the default kernel's result and time to compare with.
    Calling the default kernel first lets it report missing or unknown operands."""
    objective = Objective(
        statement=expr,
        formats=fmts,
        target=target,
        dtype=dtype,
        index_dtype=index_dtype,
        operands=tensors,
        shapes=shapes,
        extents={},
        choices=format_space.format_choices(expr, fmts, tensors) if search else {},
    )
    objective.reference = comparable(objective.rebase())
    objective.extents = _sizes(expr, tensors, shapes)[0]
    return objective


def _sweep(objective: Objective, limit: int) -> list[dict[str, Any]]:
    """The parameters of every schedule of the space of the given formats; a UcfError
    naming the limit where there are more than ``limit``."""
    v = objective.variant(objective.formats)
    found = every_schedule(v.problem, limit)
    if found is None:
        raise UcfError(
            f"tune(exhaustive=True): the space of {objective.statement} has more than "
            f"{limit} schedules (trials={limit}); give more trials or sample it instead"
        )
    return list(found.values())


def _first(objective: Objective, trials: int) -> list[dict[str, Any]]:
    """The parameters of the default schedule on the given formats; then, formats
    searched, on the given ones with every dense input in the mode order its loops walk
    (``format_space.dense_order``), and on those with each blocked or fixed-width format offered
    for a sparse input: a search of a few dozen trials over many formats, each with a
    space of its own, would otherwise try the formats that the operands' structure
    singled out only by chance. Then, up to a ``SEED_SHARE`` of the trials, the seed
    schedules of the given formats (``space.seed_params``)."""
    from ucf.toolchain.jit import num_threads

    v = objective.variant(objective.formats)
    found = [{**_defaults(objective, v.formats, v.problem)}]
    walked = dict(objective.formats)
    for name, options in objective.choices.items():
        if objective.formats[name].is_dense:
            walked[name] = options[1]
    candidates = [walked] if walked != objective.formats else []
    for name, options in objective.choices.items():
        candidates += [{**walked, name: o} for o in options if format_space.structured(o)]
    problems: dict[int, search_problem.Problem] = {}  # by candidate, found by the check

    def check(formats: dict[str, Format]) -> None:
        problems[id(formats)] = search_problem.problem(
            objective.statement, formats, objective.extents
        )

    # formats ucf refuses are left out: their trial would fail the same way, pruned
    for formats in passing(candidates, check, refuses=_refused):
        found.append(_defaults(objective, formats, problems[id(formats)]))
    scope = objective.scope(v.formats)
    formats = {f"format_{n}": str(v.formats[n]) for n in objective.choices}
    seeds = space.seed_params(v.problem, num_threads(), scope)[: int(trials * SEED_SHARE)]
    return (found + [{**s, **formats} for s in seeds])[:trials]


def _refused(_formats: dict[str, Format], error: Exception) -> bool:
    return isinstance(error, UcfError)


def _defaults(
    objective: Objective, formats: dict[str, Format], p: search_problem.Problem
) -> dict[str, Any]:
    params = space.default_params(p, objective.scope(formats))
    params.update({f"format_{n}": str(formats[n]) for n in objective.choices})
    return params


# ------------------------------------------------------------------ studies
def _run(
    optuna, objective, key, trials, n_jobs, client, storage, seed, timeout, progress, sweep=None
):
    """The study of ``key`` with ``trials`` more trials: ``sweep``'s parameters where
    given (an exhaustive search), else the default and seeds first, then sampled."""
    url = default_storage() if storage is None else storage
    name = study_name(key, objective.choices)
    study = optuna.create_study(
        storage=open_storage(optuna, url),
        study_name=name,
        direction="minimize",
        load_if_exists=True,
        sampler=sampler(optuna, seed, trials),
    )
    study.set_user_attr("key", key)
    before = len(study.trials)
    if sweep is not None:
        first = [] if before else sweep  # a finished sweep has nothing left to try
        trials = len(first)
    else:
        first = [] if before else _first(objective, trials)  # none left waiting in the study
    if seed is not None:  # a resumed study draws new points, not the first run's again
        seed += before
    bar = Progress(trials, progress, study)
    try:
        if client is not None:
            on_dask(optuna, study, first, objective, trials, client, seed, timeout, bar)
            return study
        for params in first:
            study.enqueue_trial(params)
        if n_jobs > 1:
            in_processes(optuna, study, url, name, objective, trials, n_jobs, seed, timeout, bar)
        else:
            study.sampler = sampler(optuna, seed, trials)
            study.optimize(objective, n_trials=trials, timeout=timeout, callbacks=[bar.trial])
    finally:
        bar.close()
    return study


def _result(study: Any, objective: Objective) -> Tuned:
    """The study's best schedules timed again in turns with the default (the machine's
    load may have changed since each was first timed, ``ucf.tuning.final``); the default
    when none beats it then. Medians, not minima, rank them: with more than one thread,
    the time slices that other processes take from one thread while the others wait for
    it are what a user of a shared machine gets, and they hit statically shared loops
    hardest."""
    trials = study.get_trials(deepcopy=False)
    reasons = {_tried(t): t.user_attrs["failure"] for t in trials if "failure" in t.user_attrs}
    done = [t for t in trials if t.value is not None and "schedule" in t.user_attrs]
    default, given = objective.kernel(None), objective.variant(objective.formats)
    entries = [(None, given, default)]
    from ucf.toolchain.jit import num_threads

    for t in final.finalists(done, _plan, num_threads()) if done else []:
        schedule, formats = t.user_attrs["schedule"], t.user_attrs.get("formats")
        v = objective.variant(objective.chosen(formats) if formats else objective.formats)
        if v.formats == given.formats and probe.normalized(
            as_commands(schedule)
        ) == probe.normalized(objective.default_schedule):
            continue  # the default's own kernel: raced against itself, noise would win
        entries.append((schedule, v, objective.kernel(schedule, v.formats)))
    if len(entries) == 1:  # every trial failed, or none but the default's ran
        baseline = objective.baseline
        text = _default_schedule(default, objective)
        spelled = spelled_formats(given.formats)
        return Tuned(text, baseline, baseline, study, default, reasons, spelled, 0.0, True)
    calls = [lambda k=k, ops=v.operands: k(shapes=objective.shapes, **ops) for _, v, k in entries]
    best = final.confirmed(calls)
    schedule, v, kernel = entries[best.index]
    if best.index == 0:
        text = _default_schedule(default, objective)
        t = best.default
        spelled = spelled_formats(given.formats)
        return Tuned(text, t, t, study, default, reasons, spelled, 0.0, True)
    spelled = spelled_formats(v.formats)
    return Tuned(schedule, best.time, best.default, study, kernel, reasons, spelled, v.conversion)


def _default_schedule(default: Any, objective: Objective) -> str:
    """The schedule text of the default kernel's plan for the tuned operands."""
    default(shapes=objective.shapes, **objective.variant(objective.formats).operands)
    return default.schedule_used or ""


def _plan(trial: Any) -> tuple[str, str]:
    """What a trial ran: its schedule and its formats."""
    formats = trial.user_attrs.get("formats", {})
    return trial.user_attrs["schedule"], json.dumps(formats, sort_keys=True)


def _tried(trial: Any) -> str:
    """What a failed trial tried: its schedule, else (its formats did not fit the
    operands) its formats."""
    if "schedule" in trial.user_attrs:
        return trial.user_attrs["schedule"]
    formats = trial.user_attrs.get("formats", {})
    return "formats " + ", ".join(f"{n}={f}" for n, f in sorted(formats.items()))
