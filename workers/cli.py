"""The ``chronoq`` command line (subcommands grow with the project)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``chronoq`` console script."""
    parser = argparse.ArgumentParser(prog="chronoq", description="chronoq job scheduler")
    parser.add_subparsers(dest="command")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
