"""``python -m packer``: the same as the ``packer`` command."""

from .cli import main

main()
