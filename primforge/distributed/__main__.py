"""``python -m primforge.distributed -n N [--devices-per-process D] [--timeout S] script.py``."""

import sys

from primforge.distributed._launch import main

if __name__ == "__main__":
    sys.exit(main())
