"""``python -m runifold``: the ``runifold`` command line, as the installed ``runifold`` script runs it."""

import sys

from runifold.cli.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
