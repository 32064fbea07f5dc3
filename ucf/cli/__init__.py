"""The ``ucf`` command line: ``main`` parses and dispatches (``ucf.cli.main``); each
subcommand lives in a module of its own beside it (``ucf compile`` in
``ucf.cli.compile_command``, ``run``, ``tune``, ``demo``, ``cache`` and ``taco`` likewise,
``ucf show`` in ``ucf.cli.show``, ``ucf serve`` in ``ucf.serve``), with the options they
share in ``ucf.cli.options``."""

from ucf.cli.main import PROG, build_parser, main

__all__ = ["PROG", "build_parser", "main"]
