"""`acchead-headroom`: rounds replayed along gen-data's labels, counted by hand; the command end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from acchead.data_gen import cli as gen_cli
from acchead.train import cli as train_cli
from acchead.train.headroom import (
    Counts,
    auroc_of,
    fixed_k,
    headroom,
    main,
    oracle,
    replay,
    synthetic_probs,
    threshold,
)


def _acc(*bits: int) -> np.ndarray:
    return np.array(bits, dtype=bool)


def test_fixed_k_and_the_oracle_counted_by_hand():
    acc, p = _acc(1, 1, 0, 1), np.full(4, 0.5)
    # K = 2: round 1 drafts 2, both pass, the target adds its own (3 tokens); round 2 drafts the last one,
    # which passes, and the response ends there (1 token).
    assert replay(fixed_k(2), [acc], [p]) == Counts(tokens=4, drafted=3, target_calls=2)
    acc = _acc(0, 0, 1)
    assert replay(fixed_k(1), [acc], [np.full(3, 0.5)]) == Counts(3, 3, 3)
    assert replay(oracle, [acc], [np.full(3, 0.5)]) == Counts(3, 1, 3)  # drafts only what passes
    assert Counts(4, 3, 2).speedup(0.5) == pytest.approx(4 / 3.5)


def test_threshold_stops_on_the_candidate_that_crosses_it():
    acc, p = _acc(1, 1, 0, 1, 1), np.array([0.9, 0.9, 0.1, 0.9, 0.9])
    # h = 0.5: 0.9, 0.81, then 0.081 < 0.5 stops with the third candidate in the round (it is verified)
    assert threshold(0.5, 20)(acc, p, 0) == 3
    assert threshold(0.5, 2)(acc, p, 0) == 2  # the cap
    assert threshold(0.999, 20)(acc, p, 0) == 5  # never crosses: to the end of the response
    # a head that knows every label drafts the oracle's rounds plus the one rejected candidate per round
    sure = acc.astype(float)
    calls = replay(threshold(0.5, 20), [acc], [sure]).target_calls
    assert calls == replay(oracle, [acc], [sure]).target_calls


def test_the_oracle_bounds_every_rule():
    rng = np.random.default_rng(0)
    accept = [rng.random(n) < 0.6 for n in rng.integers(20, 60, 30)]
    probs = [rng.random(len(a)) for a in accept]
    best = replay(oracle, accept, probs).speedup(0.15)
    for rule in [fixed_k(k) for k in (1, 2, 4)] + [threshold(h, 20) for h in (0.3, 0.7)]:
        assert replay(rule, accept, probs).speedup(0.15) <= best
    row = headroom("x", accept, probs, 0.15, [1, 2, 4], [0.3, 0.7], 20)
    assert row.oracle_speedup == pytest.approx(best) and row.best_k_speedup <= best


@pytest.mark.parametrize("auroc", [0.7, 0.9, 0.97])
def test_synthetic_heads_have_the_asked_auroc_and_are_calibrated(auroc):
    rng = np.random.default_rng(1)
    accept = rng.random(40_000) < 0.6
    p = synthetic_probs(accept, auroc, rng)
    assert auroc_of(accept, p) == pytest.approx(auroc, abs=0.01)
    assert p.mean() == pytest.approx(accept.mean(), abs=0.01)  # calibrated: E[P] = the accept rate
    for lo in (0.2, 0.5, 0.8):  # and within bins
        sel = (p > lo) & (p < lo + 0.1)
        assert accept[sel].mean() == pytest.approx(p[sel].mean(), abs=0.03)
    assert math.isnan(auroc_of(np.ones(3, dtype=bool), np.ones(3)))


@pytest.fixture(scope="module")
def lookahead_run(tiny_pair_dirs, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("headroom")
    prompts = root / "prompts.jsonl"
    lines = [json.dumps({"prompt": f"def f{i}(x):\n    return x"}) for i in range(10)]
    prompts.write_text("\n".join(lines) + "\n")
    target, draft = tiny_pair_dirs
    data, head = root / "d", root / "h"
    assert gen_cli.main(["--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
                         "--max-new-tokens", "12", "--out", str(data)]) == 0  # fmt: skip
    assert train_cli.main(["--data", str(data), "--w-rej", "6", "--depth", "3", "--epochs", "2",
                           "--no-progress", "--logger", "none", "--out", str(head)]) == 0  # fmt: skip
    return {"data": data, "head": head / "head.safetensors"}


def test_the_command_replays_a_head_and_synthetic_heads(lookahead_run, capsys):
    assert main(["--data", str(lookahead_run["data"]), "--head", str(lookahead_run["head"]),
                 "--aurocs", "0.8,0.95", "--k-grid", "1,2"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "10 responses" in out and "(validation prompts)" in out
    assert "synthetic, AUROC 0.8 |" in out and "synthetic, AUROC 0.95 |" in out
    assert out.count("× (K = ") == 3


def test_bad_input_is_a_one_line_error(lookahead_run, tmp_path, capsys):
    data = str(lookahead_run["data"])
    assert main(["--data", str(tmp_path / "missing")]) == 2
    assert main(["--data", data, "--h-grid", "0.5,1.5"]) == 2
    assert main(["--data", data, "--aurocs", "0.3"]) == 2
    chain = tmp_path / "chain"
    chain.mkdir()
    cfg = json.loads((lookahead_run["data"] / "gen_config.json").read_text())
    (chain / "gen_config.json").write_text(json.dumps({**cfg, "mix_ratio": 0.15}))
    assert main(["--data", str(chain)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(": error: " in line for line in err)
    assert "--mix-ratio 1" in err[-1]
    for bad in (["--k-grid", ""], ["--h-grid", ","], ["--aurocs", ""], ["--cost-ratio", "nan"]):
        assert main(["--data", data, *bad]) == 2  # a traceback or an empty (nan) table before
    assert capsys.readouterr().err.count(": error: ") == 4
    with pytest.raises(SystemExit):  # argparse's own usage error: a K is a whole number
        main(["--data", data, "--k-grid", "1.5"])


def test_a_head_of_another_draft_or_sampling_is_refused(lookahead_run, tmp_path, capsys):
    """The head must be the data's draft's and trained under the data's S: it printed numbers for another
    draft of the same width before, and a traceback for one of another width."""
    import dataclasses

    from acchead.head_io import load_head, save_head
    from acchead.sampling import SamplingConfig

    head, meta = load_head(lookahead_run["head"])
    another = dataclasses.replace(meta, draft={**meta.draft, "fingerprint": "0" * 16})
    other_draft = save_head(head, tmp_path / "draft.safetensors", meta=another)
    sampled = save_head(head, tmp_path / "t1.safetensors",
                        meta=dataclasses.replace(meta, sampling=SamplingConfig(1.0).to_dict()))  # fmt: skip
    data = str(lookahead_run["data"])
    assert main(["--data", data, "--head", str(other_draft)]) == 2
    assert main(["--data", data, "--head", str(sampled)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "fingerprint" in err[0] and "was trained under" in err[1], err
