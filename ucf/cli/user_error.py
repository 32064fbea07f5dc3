"""The command line's own mistakes (a tensor given two formats, a missing input file),
in a module of their own so that every subcommand raises the one class ``main`` reports
like a ``UcfError``."""


class UserError(Exception):
    """A CLI-level mistake (e.g. a tensor given two formats) reported like a UcfError."""
