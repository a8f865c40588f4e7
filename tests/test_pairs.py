"""`--pair toy|smollm2`: the named pairs' models and heads, overridden one by one by --target / --draft;
a missing asset or draft is one line naming what provides it; every command takes the flag."""

from __future__ import annotations

import pytest

from acchead import demo_pair
from acchead.data_gen.config import build_parser as gen_data_parser
from acchead.errors import AccheadError
from acchead.inference import cli_decode
from acchead.inference.bench.config import build_parser as bench_parser
from acchead.pairs import PAIR_NAMES, default_heads, resolve_pair
from acchead.sampling import SamplingConfig


def test_toy_is_the_demo_pair_and_flags_override_it():
    toy = resolve_pair(None)
    assert (toy.name, toy.target, toy.draft) == ("toy", str(demo_pair.TARGET_DIR), str(demo_pair.DRAFT_DIR))
    assert resolve_pair("toy", draft="my/draft").draft == "my/draft"
    greedy = default_heads("toy", SamplingConfig(0.0))
    assert greedy and greedy[0] == demo_pair.default_head(SamplingConfig(0.0))
    with pytest.raises(AccheadError, match="unknown pair 'big'; choose one of toy, smollm2"):
        resolve_pair("big")


def test_smollm2_names_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path))
    with pytest.raises(AccheadError, match=r"asset smollm2-target is not installed .*run `acchead-assets`"):
        resolve_pair("smollm2")
    monkeypatch.setattr("acchead.pairs.SMOLLM2_DRAFT_DIR", tmp_path / "no-draft")
    with pytest.raises(AccheadError, match=r"no distilled SmolLM2 draft is shipped yet .*pass --draft"):
        resolve_pair("smollm2", target="t")
    assert resolve_pair("smollm2", target="t", draft="d") == resolve_pair("smollm2", "t", "d")


def test_smollm2_heads_are_the_ones_shipped_for_s(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr("acchead.pairs.SMOLLM2_HEADS_DIR", tmp_path)
    greedy, t1 = SamplingConfig(0.0), SamplingConfig(1.0, 50)
    assert default_heads("smollm2", greedy) == []  # none shipped: commands need --head (no toy fallback)
    for name in ("a-greedy", "b-greedy"):
        (tmp_path / name).mkdir()
        shutil.copy(demo_pair.default_head(greedy), tmp_path / name / "head.safetensors")
    files = [tmp_path / n / "head.safetensors" for n in ("a-greedy", "b-greedy")]
    assert default_heads("smollm2", greedy) == files
    (tmp_path / "defaults.json").write_text('{"greedy": "b-greedy"}')
    assert default_heads("smollm2", greedy)[0] == tmp_path / "b-greedy" / "head.safetensors"
    assert default_heads("smollm2", t1) == []  # trained under greedy only


def test_training_finds_a_named_pairs_draft(tmp_path, monkeypatch):
    from acchead.pairs import shipped_drafts

    monkeypatch.setattr("acchead.pairs.SMOLLM2_DRAFT_DIR", tmp_path / "none")
    assert shipped_drafts() == [demo_pair.DRAFT_DIR]  # without a SmolLM2 draft
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr("acchead.pairs.SMOLLM2_DRAFT_DIR", tmp_path)
    assert shipped_drafts() == [demo_pair.DRAFT_DIR, tmp_path]


def test_every_command_takes_the_flag(capsys, tmp_path, monkeypatch):
    assert gen_data_parser().parse_args(["--pair", "smollm2", "--out", "x"]).pair == "smollm2"
    assert bench_parser().parse_args(["--pair", "smollm2"]).pair == "smollm2"
    assert set(PAIR_NAMES) == {"toy", "smollm2"}
    monkeypatch.setenv("ACCHEAD_CACHE_DIR", str(tmp_path))
    assert cli_decode.main(["--pair", "smollm2", "--policy", "specdec:k=2"]) == 2
    assert "run `acchead-assets`" in capsys.readouterr().err
    assert cli_decode.main(["--pair", "smollm2"]) == 2  # its shipped greedy head, then the missing target
    assert "run `acchead-assets`" in capsys.readouterr().err
    assert cli_decode.main(["--pair", "smollm2", "--temperature", "1"]) == 2  # its shipped T = 1 head
    assert "run `acchead-assets`" in capsys.readouterr().err
    assert cli_decode.main(["--pair", "smollm2", "--temperature", "0.7"]) == 2  # specdecpp, no head for S
    err = capsys.readouterr().err
    assert "the smollm2 pair ships no acceptance head for temperature=0.7,top_k=0,top_p=1: pass --head" in err


def test_the_smollm2_pair_ships_its_demo_head_for_greedy_decoding():
    """`make demo`'s head (docs/real-pair.md, "What the head reads"), rounded to bfloat16: the commands'
    default under greedy S, a lookahead head of the draft's statistics alone, recorded for the shipped
    draft (`test_real_pair.py` loads it against that draft: the fingerprint needs the target's asset)."""
    import json

    from acchead.head_io import load_head
    from acchead.pairs import SMOLLM2_DRAFT_DIR, SMOLLM2_HEADS_DIR

    (path,) = default_heads("smollm2", SamplingConfig(0.0))
    assert path == SMOLLM2_HEADS_DIR / "greedy-lookahead" / "head.safetensors"
    _, meta = load_head(path)
    assert (meta.kind, tuple(meta.inputs)) == ("lookahead", ("logq", "entropy", "topk"))
    assert (meta.width, meta.depth, meta.w_rej) == (32, 3, 6.0)
    assert meta.sampling_config == SamplingConfig(0.0) and meta.draft["name"] == SMOLLM2_DRAFT_DIR.name
    cfg = json.loads((SMOLLM2_DRAFT_DIR / "config.json").read_text())
    assert (meta.draft["hidden_size"], meta.draft["vocab_size"]) == (cfg["hidden_size"], cfg["vocab_size"])
    assert default_heads("smollm2", SamplingConfig(0.7)) == []  # no head trained under that S


def test_the_smollm2_pair_ships_a_head_for_sampling_at_temperature_one():
    """A head on gen-data's T = 1 labels (docs/real-pair.md, "A head for T = 1"): the default under T = 1,
    8 wide so that it reads the draft's state within the repo's weight budget (the state ranks T = 1's
    accepts better than the statistics alone, unlike greedy's)."""
    from acchead.head_io import load_head
    from acchead.pairs import SMOLLM2_DRAFT_DIR, SMOLLM2_HEADS_DIR

    (path,) = default_heads("smollm2", SamplingConfig(1.0))
    assert path == SMOLLM2_HEADS_DIR / "t1-lookahead" / "head.safetensors"
    _, meta = load_head(path)
    assert (meta.kind, tuple(meta.inputs)) == ("lookahead", ("state", "logq", "entropy", "topk"))
    assert (meta.width, meta.depth, meta.w_rej) == (8, 3, 6.0)
    assert meta.sampling_config == SamplingConfig(1.0) and meta.draft["name"] == SMOLLM2_DRAFT_DIR.name


def test_the_shipped_smollm2_draft_fits_the_repos_weight_budget():
    """Issue 31: the real pair's weights in the repo stay <= 25 MB in all, bf16 safetensors."""
    from safetensors import safe_open

    from acchead.pairs import PAIR_FILES

    files = sorted(PAIR_FILES.rglob("*.safetensors"))
    assert files, f"no weights under {PAIR_FILES}"
    assert sum(f.stat().st_size for f in files) <= 25_000_000
    for f in files:
        with safe_open(f, framework="pt") as st:
            floats = {st.get_slice(k).get_dtype() for k in st.keys()} - {"I64", "I32"}  # noqa: SIM118
            assert floats == {"BF16"}, f"{f}: {floats}"
