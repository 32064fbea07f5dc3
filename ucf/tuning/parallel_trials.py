"""Running a study's trials beyond this process: in spawned worker processes that share
the study through its storage, or as tasks on a Dask cluster that share a copy held
on the scheduler, and the progress bar that follows them (used for trials in this
process too). ``ucf.tuning.study`` decides how a study runs; this is the running."""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any

from ucf.errors import ConversionWarning
from ucf.tuning.deps import need
from ucf.tuning.measure import Objective
from ucf.tuning.study_storage import open_storage, sampler


def _shares(trials: int, workers: int) -> list[int]:
    return [n for r in range(workers) if (n := trials // workers + (r < trials % workers))]


@dataclass(frozen=True)
class OnDask:
    """The Dask storage ``name``, opened where a task runs (building it there keeps its
    'experimental' warning out of every worker's log)."""

    name: str

    def open(self) -> Any:
        from optuna_integration.dask import DaskStorage

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", need("optuna").exceptions.ExperimentalWarning)
            return DaskStorage(name=self.name, register=False)


def optimize(storage: Any, name: str, objective: Objective, trials: int, seed, timeout) -> None:
    """Run ``trials`` trials of the study ``name`` in this (worker) process."""
    optuna = need("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage.open() if isinstance(storage, OnDask) else open_storage(optuna, storage)
    study = optuna.load_study(
        study_name=name, storage=storage, sampler=sampler(optuna, seed, trials)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionWarning)
        try:
            study.optimize(objective, n_trials=trials, timeout=timeout)
        finally:
            objective.close()


def in_processes(optuna, study, url, name, objective, trials, n_jobs, seed, timeout, bar):
    """Worker processes share the study through its storage. They are spawned, not
    forked: a forked child of a process that has run OpenMP threads can hang."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(n_jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [
            pool.submit(
                optimize, url, name, objective, n, None if seed is None else seed + r, timeout
            )
            for r, n in enumerate(_shares(trials, n_jobs))
        ]
        bar.follow(study, futures)


def on_dask(optuna, study, first, objective, trials, client, seed, timeout, bar):
    """Tasks on the cluster share a copy of the study held on the scheduler by Optuna's
    Dask storage, and the new trials are copied back into ``study`` afterwards: the
    study's own storage (a file on this machine, say) need not be reachable from the
    cluster. Each worker compiles through the kernel cache of its own machine."""
    need("optuna_integration", "tune on Dask")
    from optuna_integration.dask import DaskStorage

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        shared = DaskStorage(client=client)
    remote = optuna.create_study(storage=shared, study_name=study.study_name, direction="minimize")
    done = [t for t in study.get_trials() if t.state.is_finished()]
    remote.add_trials(done)
    for params in first:
        remote.enqueue_trial(params)
    workers = len(client.scheduler_info()["workers"]) or 1
    futures = [
        client.submit(
            optimize,
            OnDask(shared.name),
            study.study_name,
            objective,
            n,
            None if seed is None else seed + r,
            timeout,
            pure=False,
        )
        for r, n in enumerate(_shares(trials, workers))
    ]
    try:
        bar.follow(remote, futures)
    finally:
        new = remote.get_trials()[len(done) :]
        study.add_trials([t for t in new if t.state.is_finished()])


class Progress:
    """A tqdm bar of finished trials and the best time so far (none without a terminal)."""

    def __init__(self, total: int, show: bool | None, study: Any):
        if show is None:
            show = sys.stderr.isatty()
        self._bar = None
        if show:
            tqdm = need("tqdm", "the tuning progress bar")
            self._bar = tqdm.tqdm(total=total, desc="ucf.tune", unit="trial")
        self._done = self._finished(study)

    @staticmethod
    def _finished(study: Any) -> int:
        return sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))

    def trial(self, study: Any, _trial: Any = None) -> None:
        if self._bar is None:
            return
        finished = self._finished(study)
        self._bar.update(max(0, min(finished - self._done, self._bar.total - self._bar.n)))
        self._done = finished
        best = [t.value for t in study.get_trials(deepcopy=False) if t.value is not None]
        if best:
            self._bar.set_postfix_str(f"best {min(best) * 1e6:.1f} us")

    def follow(self, study: Any, futures: list) -> None:
        """Update while ``futures`` run, then raise what a worker raised."""
        while not all(f.done() for f in futures):
            time.sleep(0.5)
            self.trial(study)
        for f in futures:
            f.result()
        self.trial(study)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
