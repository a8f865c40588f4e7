"""The design card's commands on their defaults: gen-data -> `acchead-train --w-rej 6 --depth 3` -> decode.

A user who passes only what the card names (models, prompts and output paths aside) must get a head of the
shipped kind and inputs, trained on what gen-data wrote, and a decoder that stops at the threshold the head
records. The same holds from Python, and on the demo pair the decoder finds the shipped head by itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from acchead.configs import config_path
from acchead.data_gen import cli as gen_cli
from acchead.errors import AccheadError
from acchead.head_io import read_head_metadata
from acchead.inference import SpeculativeDecoder, cli_decode
from acchead.models import load_causal_lm
from acchead.pairs import shipped_head_for
from acchead.sampling import SamplingConfig
from acchead.train import cli as train_cli
from acchead.train.settings import TrainSettings

PROMPTS = [f"def f{i}(x):\n    return x + {i}" + " * y" * (i % 4) for i in range(12)]


@pytest.fixture(scope="module")
def default_run(tiny_pair_dirs, tmp_path_factory) -> dict[str, Path]:
    """gen-data and acchead-train exactly as the design card writes them (plus models, prompts, paths)."""
    root = tmp_path_factory.mktemp("defaults")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    target, draft = tiny_pair_dirs
    pair = ["--target", str(target), "--draft", str(draft)]
    data, head = root / "d", root / "h"
    assert gen_cli.main([*pair, "--prompts", str(prompts), "--max-new-tokens", "12", "--out", str(data)]) == 0
    assert train_cli.main(["--data", str(data), "--w-rej", "6", "--depth", "3", "--out", str(head)]) == 0
    return {"target": target, "draft": draft, "data": data, "head": head / "head.safetensors"}


def test_train_defaults_are_the_shipped_recipe_and_the_yaml_agrees():
    import yaml

    yaml_defaults = yaml.safe_load(config_path("train").read_text())
    settings = TrainSettings(data="d")
    for key, value in yaml_defaults.items():
        if key in ("data", "out", "inputs"):
            continue
        got = getattr(settings, key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key
    assert yaml_defaults["inputs"] is None and settings.inputs == "state+token"
    assert TrainSettings(data="d", kind="candidate").inputs == "state"
    shipped = read_head_metadata(Path(__file__).parents[1] / "acchead/zoo/heads/greedy-lookahead")
    recipe = shipped.extra["training"]
    for key in ("kind", "inputs", "w_rej", "depth", "epochs", "lr", "optimizer", "schedule", "batch_size"):
        assert getattr(settings, key) == recipe[key], key
    assert shipped.default_h == settings.default_h


def test_card_commands_train_the_default_head_with_its_threshold(default_run):
    gen_config = json.loads((default_run["data"] / "gen_config.json").read_text())
    assert gen_config["mix_ratio"] == 1.0 and gen_config["sampling"]["temperature"] == 0.0
    meta = read_head_metadata(default_run["head"])
    assert (meta.kind, meta.inputs, meta.depth, meta.w_rej) == ("lookahead", ["state", "token"], 3, 6.0)
    assert meta.default_h == 0.8


def test_decode_cli_on_defaults_uses_the_heads_threshold(default_run, capsys):
    argv = [
        "--target",
        str(default_run["target"]),
        "--draft",
        str(default_run["draft"]),
        "--head",
        str(default_run["head"]),
        "--max-new-tokens",
        "10",
        "--prompt",
        "def f(x):",
        "--json",
    ]
    assert cli_decode.main(argv) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["policy"] == "specdecpp:h=0.8,max=20" and stats["sampling"]["temperature"] == 0.0
    assert stats["head_calls"] > 0


def test_python_decoder_takes_the_heads_threshold_and_stays_exact(default_run):
    target, draft = load_causal_lm(str(default_run["target"])), load_causal_lm(str(default_run["draft"]))
    dec = SpeculativeDecoder(target, draft, policy="specdecpp", head=default_run["head"])
    assert dec.policy.h == 0.8
    explicit = SpeculativeDecoder(target, draft, policy="specdecpp:h=0.3", head=default_run["head"])
    assert explicit.policy.h == 0.3
    prompt = torch.tensor([5, 17, 42, 9])
    res = dec.generate(prompt, max_new_tokens=12, temperature=0.0)
    ref = target.generate(
        prompt[None], max_new_tokens=12, do_sample=False, min_new_tokens=12, pad_token_id=0
    )[0, 4:]
    assert res.new_ids.tolist() == ref[: len(res.new_ids)].tolist()


def test_candidate_head_on_default_data_names_the_fix(default_run, tmp_path, capsys):
    argv = ["--data", str(default_run["data"]), "--kind", "candidate", "--out", str(tmp_path / "c")]
    assert train_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kind lookahead" in err[0] and "--mix-ratio 0.15" in err[0]


def test_a_head_records_the_threshold_it_was_trained_with(default_run, tmp_path):
    out = tmp_path / "h6"
    argv = [
        "--data",
        str(default_run["data"]),
        "--epochs",
        "1",
        "--default-h",
        "0.6",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert train_cli.main(argv) == 0
    assert read_head_metadata(out).default_h == 0.6
    with pytest.raises(SystemExit):  # argparse refuses a non-number
        train_cli.build_parser().parse_args(["--default-h", "x"])
    with pytest.raises(AccheadError, match="--default-h must be in"):
        TrainSettings(data="d", default_h=1.0).check()


def test_python_decoder_on_the_demo_pair_takes_its_head_from_demo_pair():
    """The decoder never picks a head, not even on the demo pair (issue 31): the caller passes the shipped
    head of its S, `acchead.demo_pair.head_for(S)`, as the commands do."""
    from acchead import demo_pair

    target, draft = load_causal_lm(str(demo_pair.TARGET_DIR)), load_causal_lm(str(demo_pair.DRAFT_DIR))
    with pytest.raises(AccheadError, match=r"needs an acceptance head: pass head=PATH .*demo_pair\.head_for"):
        SpeculativeDecoder(target, draft, policy="specdecpp")
    dec = SpeculativeDecoder(target, draft, policy="specdecpp", head=demo_pair.head_for(SamplingConfig(0.0)))
    assert dec.policy.h == 0.8 and dec.head_meta.sampling_config.greedy
    sampled = SamplingConfig(1.0, 50)
    dec = SpeculativeDecoder(target, draft, policy="specdecpp", head=demo_pair.head_for(sampled))
    assert dec.head_meta.sampling_config == sampled  # the T = 1 / top-k 50 head
    dec.generate([5, 17, 42], max_new_tokens=4, temperature=1.0, top_k=50)
    # An S without a shipped head: the greedy default (the decoder warns about the mismatch).
    assert demo_pair.head_for(SamplingConfig(0.7)) == demo_pair.head_for(SamplingConfig(0.0))
    assert shipped_head_for(draft, sampled) == demo_pair.head_for(sampled)


def test_specdecpp_without_a_head_is_one_line(tiny_llama_pair):

    target, draft = tiny_llama_pair
    with pytest.raises(AccheadError, match="needs an acceptance head") as e:
        SpeculativeDecoder(target, draft, policy="specdecpp")
    assert "\n" not in str(e.value)
    assert shipped_head_for(draft, SamplingConfig(0.0)) is None  # never guessed for another draft
