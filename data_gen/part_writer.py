"""When a gen-data process writes its labelled batches to disk: as parts, so a kill loses little work.

The parts themselves, their checks on resume and the final merge are `acchead.data_gen.shards`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from acchead.data_gen.labeler import LabeledRow
from acchead.data_gen.shards import Part, RunDir


class PartWriter:
    """Collects one process's labelled batches and writes them as parts, so a kill loses little work.

    A part is written once it holds `max_prompts` prompts or `max_seconds` have passed since the previous
    write, whichever comes first (checked after each batch), before a batch that does not continue it (a
    resumed run's pending batches have gaps), and at `close`. What reaches the disk when never changes
    what the rows are: batches are planned over the whole run.

    Args:
        run_dir: where parts go.
        hidden_size: the draft's H when features are cached, else None.
        max_prompts: `--shard-size`.
        max_seconds: `--flush-seconds`.
        clock: seconds, monotonic (tests inject one).
    """

    def __init__(
        self,
        run_dir: RunDir,
        hidden_size: int | None,
        max_prompts: int,
        max_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.run_dir, self.hidden_size = run_dir, hidden_size
        self.max_prompts, self.max_seconds, self.clock = max_prompts, max_seconds, clock
        self.rows: list[LabeledRow] = []
        self.first = self.end = -1
        self.since = clock()
        self.written: list[Part] = []

    def add(self, batch: int, rows: list[LabeledRow]) -> None:
        """Add the rows of batch `batch`; write the part if it is due."""
        if self.rows and batch != self.end:
            self.flush()
        if not self.rows:
            self.first = batch
        self.rows += rows
        self.end = batch + 1
        if len(self.rows) >= self.max_prompts or self.clock() - self.since >= self.max_seconds:
            self.flush()

    def flush(self) -> None:
        """Write the collected batches as one part now (nothing if none)."""
        if self.rows:
            part = (self.first, self.end)
            self.run_dir.write_shard(part, self.rows, self.hidden_size)
            self.written.append(part)
            self.rows = []
        self.since = self.clock()

    close = flush
