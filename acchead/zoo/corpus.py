"""The demo corpus: the running interpreter's standard-library source, split into LM-train and held-out files.

The split lives in the core (`acchead.demo_pair`), where MaG's bigram corpus and the commands read it
without importing the builder; re-exported here for the builder's modules (issue 31).
"""

from __future__ import annotations

from acchead.demo_pair import (
    MAX_FILE_BYTES,
    NUM_HELDOUT_FILES,
    read_source,
    split_files,
    stdlib_dir,
    stdlib_files,
)

__all__ = ["MAX_FILE_BYTES", "NUM_HELDOUT_FILES", "read_source", "split_files", "stdlib_dir", "stdlib_files"]
