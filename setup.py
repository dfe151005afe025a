"""Build the compiled parts of packer: the lossless JPEG re-tiler of the ``tiled`` codec, and the
CPU kernel of the batched raw crop-resize (``packer.rawcrop``).

Everything else is in pyproject.toml. Both extensions are optional: without a C compiler packer
installs and works; only ``--codec tiled`` builds refuse with a clear error (reading tiled
datasets needs no compiled code), and batched raw crops run on torch's kernels instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("packer.codecs._jpegtiles", ["packer/codecs/_jpegtiles.c"], optional=True,
                  extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra"]),
        # -O3: the inner loops are plain float multiply-adds the compiler vectorises.
        Extension("packer._rawresample", ["packer/_rawresample.c"], optional=True,
                  extra_compile_args=["-O3", "-std=c99", "-Wall", "-Wextra"]),
    ],
)
