"""``python -m ucf``: the ``ucf`` script, for when Debian's unrelated ``/usr/bin/ucf``
comes first on PATH."""

import sys

from ucf.cli import main

sys.exit(main())
