"""``python -m caramel ARGS``: the ``caramel`` command."""

import sys

from caramel.cli import main

if __name__ == "__main__":
    sys.exit(main())
