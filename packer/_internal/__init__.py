"""packer's internals: helpers the public modules share and no user should import.

Nothing here is API: names may change in any release. What a user needs from them is re-exported
by a public module (``packer.decode.check_reader_formats``, the errors in ``packer.errors``).

- ``files``: opening dataset and source files safely (folder handles, ``O_NOFOLLOW``, bounded reads).
- ``names``: sample keys and file names, escaped one-to-one.
- ``machine``: what this machine has (cores, memory, page size, O_DIRECT).
- ``progress``: progress bars and their quiet fallbacks.
- ``imageheaders``: a header parser for the common image formats, before Pillow.
- ``imageinfo``: an image's format, size and mode from its bytes (Pillow's plugins, bounded).
- ``pillowformats``: which formats Pillow decodes and which readers decode which.
"""
