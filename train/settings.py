"""Every knob of a head training run, as one dataclass (no heavy imports: the CLI builds it before torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from acchead.errors import AccheadError

# What a head reads when --inputs is not given: the shipped lookahead heads' inputs (the best validation
# AUROC among input sets costing at most 3% of a draft step); a candidate head reads the state only.
DEFAULT_INPUTS = {"lookahead": "state+token", "candidate": "state"}


@dataclass
class TrainSettings:
    """Every knob of a training run; the CLI flags and configs/train.yaml keys map 1:1 onto these fields.

    The defaults are the recipe of the shipped heads (configs/train.yaml says why each was chosen), so the
    design card's `acchead-train --data D --w-rej 6 --depth 3 --out H` trains on gen-data's defaults.
    """

    data: str
    out: str | None = None
    w_acc: float = 1.0
    w_rej: float = 3.0
    depth: int = 3
    width: int | None = None  # None: the draft's hidden size
    kind: str = "lookahead"
    inputs: str | None = None  # None: DEFAULT_INPUTS of the kind (set in __post_init__)
    default_h: float = 0.8
    optimizer: str = "adam"
    lr: float = 3e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: str = "cosine"
    warmup: float = 0.0
    epochs: int = 8
    batch_size: int = 1024
    batch_sequences: int = 32
    features: str = "auto"
    draft: str | None = None
    pair: str | None = None
    draft_dtype: str = "float32"
    val_fraction: float = 0.1
    seed: int = 0
    accelerator: str = "auto"
    devices: str = "auto"
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    logger: str | None = "csv"
    resume: str | None = None
    checkpoints: bool = True
    checkpoint_every: float = 60.0
    progress: bool = True
    ece_bins: int = 15
    threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.inputs is None:
            self.inputs = DEFAULT_INPUTS.get(self.kind, "state")

    def check(self) -> None:
        """One-line AccheadError for values no run can use."""
        checks = [
            (self.w_rej > 0, f"--w-rej must be > 0, got {self.w_rej}"),
            (self.w_acc > 0, f"--w-acc must be > 0, got {self.w_acc}"),
            (self.threads is None or self.threads >= 1, f"--threads must be >= 1, got {self.threads}"),
            (self.depth >= 0, f"--depth must be >= 0, got {self.depth}"),
            (self.width is None or self.width >= 1, f"--width must be >= 1, got {self.width}"),
            (0 < self.default_h < 1, f"--default-h must be in (0, 1), got {self.default_h}"),
            (self.kind in ("candidate", "lookahead"), f"--kind must be candidate or lookahead: {self.kind}"),
            (self.lr > 0, f"--lr must be > 0, got {self.lr}"),
            (self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}"),
            (self.checkpoint_every >= 0, f"--checkpoint-every must be >= 0, got {self.checkpoint_every}"),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (self.batch_sequences >= 1, f"--batch-sequences must be >= 1, got {self.batch_sequences}"),
            (0 <= self.warmup < 1, f"--warmup must be in [0, 1), got {self.warmup}"),
            (self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}"),
            (self.optimizer in ("adam", "adamw"), f"--optimizer must be adam or adamw, got {self.optimizer}"),
            (
                self.schedule in ("cosine", "constant"),
                f"--schedule must be cosine or constant: {self.schedule}",
            ),
            (self.features in ("auto", "cached", "on-the-fly"), f"unknown --features {self.features!r}"),
            (self.num_nodes >= 1, f"--num-nodes must be >= 1, got {self.num_nodes}"),
            (self.ece_bins >= 1, f"ece_bins must be >= 1, got {self.ece_bins}"),
            (
                len(self.betas) == 2 and all(type(b) in (int, float) and 0 <= b < 1 for b in self.betas),
                f"--betas must be two numbers in [0, 1), got {' '.join(map(str, self.betas))}",
            ),
            (isinstance(self.extra, dict), f"extra must be a mapping, got {self.extra!r}"),
            (
                self.logger in (None, "csv", "tensorboard"),
                f"--logger must be csv or tensorboard: {self.logger}",
            ),
        ]
        for ok, msg in checks:
            if not ok:
                raise AccheadError(msg)
        from acchead.lookahead import check_kind, parse_inputs

        check_kind(self.kind, parse_inputs(self.inputs))

    @property
    def input_names(self) -> tuple[str, ...]:
        """`inputs` parsed: e.g. "state+logq" -> ("state", "logq")."""
        from acchead.lookahead import parse_inputs

        return parse_inputs(self.inputs)
