"""The ``ucf`` command line: ``main`` parses and dispatches (``ucf.cli.main``); the
commands that speak other programs' languages live beside it (``ucf taco`` in
``ucf.cli.taco_command``, ``ucf show`` in ``ucf.cli.show``, ``ucf serve`` in ``ucf.serve``)."""

from ucf.cli.main import PROG, build_parser, main

__all__ = ["PROG", "build_parser", "main"]
