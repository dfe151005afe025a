"""Sources: every kind of input ``packer build`` takes, listed into one flat listing.

TODO contract docstring
"""

from __future__ import annotations

from .detect import SOURCE_KINDS, list_any_source
from .labels import LABEL_TYPES, check_label_type
from .listing import (
                      REJECTION_REASONS,
                      Rejection,
                      SourceListing,
                      empty_source_error,
                      file_stamp,
                      rejection_summary,
                      select_rows,
)

__all__ = ["SOURCE_KINDS", "LABEL_TYPES", "REJECTION_REASONS", "Rejection", "SourceListing", "list_any_source",
           "check_label_type", "empty_source_error", "file_stamp", "rejection_summary", "select_rows"]
