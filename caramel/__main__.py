"""``python -m caramel ARGS``: the ``caramel`` command."""

from caramel.cli import console

if __name__ == "__main__":
    console()
