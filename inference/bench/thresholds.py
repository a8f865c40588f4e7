"""The targets the bench report judges a run against, read from the `goals:` section of the bench config.

`configs/bench.yaml` says where each number comes from (issues 10 and 11); a `--config` file may change
single keys. The report only states them: `acchead.inference.bench.goals` and
`acchead.inference.bench.speed_report` judge the rows against a `GoalThresholds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from acchead.errors import AccheadError


@dataclass(frozen=True)
class GoalThresholds:
    """Every goal's threshold (the keys of `goals:` in configs/bench.yaml; no defaults: the file has them).

    ratio: the declared cost ratio c = t_draft / t_target the ratio goals are judged at.
    greedy_over_specdec: greedy, best SpecDec++ / best fixed K, at c = `ratio` and at the fitted costs.
    greedy_over_rules: greedy, best SpecDec++ / best confidence threshold and / best AdaEDL setting.
    greedy_oracle_gap: greedy, share of the fixed-K-to-oracle speedup gap SpecDec++ captures.
    sampling_over_specdec: sampling, best SpecDec++ / best fixed K at c = `ratio`.
    head_overhead_max: a head call / a draft step, per head (at most).
    generate_wrapper_min: our decoder through transformers' `generate` / called directly (wall clock).
    cpu_ar_over_generate: CPU, our autoregressive decoding / transformers' `generate` (wall clock).
    cpu_k_over_assisted: CPU, our best fixed K / HF assisted generation (wall clock).
    gpu_ar_ms_per_token: GPU, our autoregressive decoding on the fast path, ms per token (at most).
    gpu_k_over_assisted: GPU, our best fixed K / HF assisted generation (wall clock).
    """

    ratio: float
    greedy_over_specdec: float
    greedy_over_rules: float
    greedy_oracle_gap: float
    sampling_over_specdec: float
    head_overhead_max: float
    generate_wrapper_min: float
    cpu_ar_over_generate: float
    cpu_k_over_assisted: float
    gpu_ar_ms_per_token: float
    gpu_k_over_assisted: float

    @property
    def ratio_key(self) -> str:
        """`ratio` as the rows' `ratio_speedups` key ("0.2")."""
        return f"{self.ratio:g}"

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any], where: str = "goals") -> GoalThresholds:
        """Thresholds from the config's `goals` mapping; AccheadError (one line) for a missing or unknown
        key, or a value that is not a finite number >= 0."""
        if not isinstance(cfg, Mapping):
            raise AccheadError(f"{where}: a mapping of goal names to numbers, got {cfg!r}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(cfg) - set(names))
        missing = [n for n in names if cfg.get(n) is None]
        if unknown or missing:
            what = f"unknown keys {', '.join(unknown)}" if unknown else f"no value for {', '.join(missing)}"
            raise AccheadError(f"{where}: {what}")
        values: dict[str, float] = {}
        for name in names:
            v = cfg[name]
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
                raise AccheadError(f"{where}: bad value for {name}: {v!r} (a finite number >= 0)")
            values[name] = float(v)
        return cls(**values)

    @classmethod
    def shipped(cls) -> GoalThresholds:
        """The thresholds of the shipped configs/bench.yaml."""
        from acchead.configs import config_path
        from acchead.layered_config import read_mapping

        path = config_path("bench")
        return cls.from_mapping(read_mapping(path).get("goals") or {}, f"{path}: goals")

    def to_dict(self) -> dict[str, float]:
        return asdict(self)
