"""Build the one compiled part of packer: the lossless JPEG re-tiler of the ``tiled`` codec.

Everything else is in pyproject.toml. The extension is optional: without a C compiler packer
installs and works, and only ``--codec tiled`` builds refuse with a clear error (reading tiled
datasets needs no compiled code).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("packer.codecs._jpegtiles", ["packer/codecs/_jpegtiles.c"], optional=True,
                  extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra"]),
    ],
)
