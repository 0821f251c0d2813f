"""``python -m primforge``: the same as the ``primforge`` command."""

import sys

from primforge.cli import main

if __name__ == "__main__":
    sys.exit(main())
