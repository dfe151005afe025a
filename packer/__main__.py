"""``python -m packer`` and the ``packer`` command: the CLI, with Ctrl-C handled from the first instant."""

import sys


def entry() -> None:
    """Import and run the CLI; Ctrl-C while the CLI's modules load also prints one line and exits 130."""
    try:
        from .cli import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    main()


if __name__ == "__main__":
    entry()
