"""The optional packages tuning needs (the ``tune`` extra), imported when first used."""

from __future__ import annotations

import importlib
from types import ModuleType

from ucf.errors import MissingDependencyError

#: Module name -> the name pip installs it by.
PIP = {"optuna_integration": "optuna-integration"}


def need(module: str, feature: str = "ucf.tune") -> ModuleType:
    """``module``, or a MissingDependencyError with the command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        name = PIP.get(module, module)
        raise MissingDependencyError(
            f"{feature} needs {name}, which is not installed: pip install {name} (or pip "
            "install '.[tune]' in a ucf checkout)"
        ) from None
