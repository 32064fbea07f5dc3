"""Where ``ucf.tune``'s studies are kept: the SQLite database in the kernel cache
directory (opened in write-ahead-log mode, synced at checkpoints), each study's name
(what the schedule is tuned for) and the sampler a study is opened with. The tuner
(``ucf.tuning.study``) and its workers (``ucf.tuning.parallel_trials``) open studies
the same way through these."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ucf.toolchain import cache
from ucf.tuning import space

#: The study database in the cache directory.
DATABASE = "tune.db"
#: Seconds a process waits for another's write to the SQLite file.
SQLITE_TIMEOUT = 60
#: The longest study name Optuna's database takes.
MAX_NAME = 512


def default_storage() -> str:
    """The URL of the study database in the kernel cache directory."""
    return f"sqlite:///{cache.cache_dir() / DATABASE}"


def open_storage(optuna, storage: Any) -> Any:
    """An SQLite URL as Optuna's storage, its file in write-ahead-log mode and synced at
    checkpoints only: Optuna commits a dozen times a trial, and a sync per commit (10 ms
    on this machine's disk) cost a 50-trial study 9 s. A crash may lose the last trials,
    never the file."""
    if not (isinstance(storage, str) and storage.startswith("sqlite")):
        return storage
    from sqlalchemy import event

    rdb = optuna.storages.RDBStorage(
        storage, engine_kwargs={"connect_args": {"timeout": SQLITE_TIMEOUT}}
    )
    event.listen(rdb.engine, "connect", _sqlite_pragmas)
    rdb.engine.dispose()  # connections opened while Optuna set the file up get the pragmas too
    return rdb


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def sampler(optuna, seed: int | None, trials: int) -> Any:
    startup = max(3, min(10, trials // 3))
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)


def study_name(key: dict[str, Any], choices: Mapping[str, Any] | None = None) -> str:
    """The study of ``key``: its JSON, readable in Optuna's tools, cut to fit the
    storage's 512 characters (a digest keeps cut names apart). A search over formats
    has parameters of its own, so it is a study of its own, and so is each set of
    format ``choices`` (they depend on the operands' structure, not only on the key,
    and Optuna refuses a parameter whose choices change within a study)."""
    fields = {**key, "space": space.SPACE_VERSION}
    if choices:
        fields["formats_searched"] = {n: [str(f) for f in c] for n, c in sorted(choices.items())}
    name = json.dumps(fields, sort_keys=True)
    if len(name) <= MAX_NAME:
        return name
    return f"{name[: MAX_NAME - 20]} #{hashlib.sha256(name.encode()).hexdigest()[:16]}"
