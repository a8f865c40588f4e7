"""acchead-gen-data end to end on tiny local models: the on-disk contract, resumption, refusals, bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import yaml
from conftest import make_tiny_tokenizer

from acchead.configs import config_path
from acchead.data_gen import cli
from acchead.data_gen.config import DEFAULT_MIX_RATIO, build_parser, parse_args
from acchead.data_gen.labeler import Labeler
from acchead.data_gen.shards import RunDir
from acchead.errors import AccheadError

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [f"def f{i}(x):\n    return x + {i}" + " * y" * (i % 4) for i in range(10)]


def write_jsonl(path: Path, prompts: list[str], field: str = "prompt") -> Path:
    path.write_text("".join(json.dumps({field: p}) + "\n" for p in prompts))
    return path


def base_args(pair_dirs, prompts_file: Path, out: Path, *extra: str) -> list[str]:
    target, draft = pair_dirs
    return [
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--prompts",
        str(prompts_file),
        "--out",
        str(out),
        "--max-new-tokens",
        "8",
        "--temperature",
        "0.8",
        "--top-p",
        "0.95",
        "--batch-size",
        "3",
        "--shard-size",
        "3",
        "--cache-features",
        "on",
        *extra,
    ]


def read_run(out: Path) -> tuple[dict, np.ndarray, dict]:
    return (
        datasets.load_from_disk(str(out)).to_dict(),
        np.load(out / "features.npy"),
        json.loads((out / "gen_config.json").read_text()),
    )


@pytest.fixture
def prompts_file(tmp_path) -> Path:
    return write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)


@pytest.fixture
def reference(tiny_pair_dirs, prompts_file, tmp_path) -> tuple[dict, np.ndarray, dict]:
    """An uninterrupted run."""
    out = tmp_path / "ref"
    assert cli.main(base_args(tiny_pair_dirs, prompts_file, out)) == 0
    return read_run(out)


def test_output_follows_the_contract(reference):
    rows, feats, cfg = reference
    assert rows["prompt_index"] == list(range(len(PROMPTS)))
    assert {
        "format",
        "version",
        "target",
        "draft",
        "sampling",
        "mix_ratio",
        "seed",
        "max_new_tokens",
        "prompts",
        "counts",
        "features",
    } <= set(cfg)
    assert cfg["format"] == "acchead-gen-data" and cfg["version"] == 1
    assert cfg["sampling"] == {"temperature": 0.8, "top_k": 0, "top_p": 0.95}
    n_draft = [sum(fd) for fd in rows["from_draft"]]
    labels = np.concatenate([np.asarray(a, np.float32) for a in rows["accept_prob"]])
    c = cfg["counts"]
    assert (
        c["rows"] == len(PROMPTS) and c["positions"] == labels.size and c["draft_positions"] == sum(n_draft)
    )
    assert c["mean_label"] == pytest.approx(labels.mean()) and c["share_label_one"] == pytest.approx(
        (labels == 1).mean()
    )
    assert feats.dtype == np.float16 and list(feats.shape) == cfg["features"]["shape"] == [sum(n_draft), 32]
    assert rows["feature_offset"] == np.concatenate([[0], np.cumsum(n_draft)[:-1]]).tolist()
    for key in ("response_ids", "draft_ids", "mixed_ids", "from_draft", "accept_prob"):
        assert [len(v) for v in rows[key]] == [len(v) for v in rows["response_ids"]]
    assert all(1 <= len(x) <= 8 for x in rows["response_ids"])


def test_resume_after_crash_equals_uninterrupted_run(
    tiny_pair_dirs, prompts_file, tmp_path, reference, monkeypatch, capsys
):
    out = tmp_path / "crashy"
    real_write, written, saved = RunDir.write_shard, [], []

    def crash_after_two(self, k, rows, hidden):
        if len(written) == 2:
            (self.shard_dir / ".part-000002-000003.tmp999.arrow").write_bytes(b"half a file")  # killed
            raise RuntimeError("simulated kill")
        real_write(self, k, rows, hidden)
        written.append(k)
        saved.extend(r.prompt_index for r in rows)

    monkeypatch.setattr(RunDir, "write_shard", crash_after_two)
    with pytest.raises(RuntimeError, match="simulated kill"):
        cli.main(base_args(tiny_pair_dirs, prompts_file, out))
    assert not (out / "gen_config.json").exists() and len(list((out / "shards").glob("part-*.arrow"))) == 2

    monkeypatch.setattr(RunDir, "write_shard", real_write)
    labelled = []
    real_label = Labeler.label
    monkeypatch.setattr(
        Labeler, "label", lambda self, idx, p: labelled.extend(idx) or real_label(self, idx, p)
    )
    assert cli.main(base_args(tiny_pair_dirs, prompts_file, out)) == 0
    assert sorted(labelled) == sorted(set(range(10)) - set(saved)), "only the unwritten parts are recomputed"
    assert len(saved) == 6
    rows, feats, cfg = read_run(out)
    assert rows == reference[0] and np.array_equal(feats, reference[1]) and cfg == reference[2]
    assert not (out / "shards").exists()
    # A finished run is reported (the summary), not redone.
    labelled.clear()
    capsys.readouterr()
    assert cli.main(base_args(tiny_pair_dirs, prompts_file, out)) == 0 and labelled == []
    summary = capsys.readouterr().out
    assert (
        "already complete: 10 rows" in summary and f"mean label {cfg['counts']['mean_label']:.4f}" in summary
    )


@pytest.mark.slow
def test_sigkill_then_same_command_resumes(tiny_pair_dirs, prompts_file, tmp_path):
    args = base_args(tiny_pair_dirs, prompts_file, tmp_path / "killed", "--shard-size", "1")  # 10 shards
    assert cli.main(base_args(tiny_pair_dirs, prompts_file, tmp_path / "ref1", "--shard-size", "1")) == 0
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # like this process (conftest): same kernels, same bits
    proc = subprocess.Popen(
        [sys.executable, "-m", "acchead.data_gen.cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while len(list((out / "shards").glob("part-*.arrow"))) < 2:
        assert proc.poll() is None and time.time() < deadline, "run ended before it could be killed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "gen_config.json").exists(), "killed too late to test resumption"
    assert cli.main(args) == 0
    rows, feats, cfg = read_run(out)
    ref = read_run(tmp_path / "ref1")
    assert rows == ref[0] and np.array_equal(feats, ref[1]) and cfg == ref[2]


@pytest.mark.slow
def test_two_accelerate_processes_give_the_same_rows_as_one(
    tiny_pair_dirs, prompts_file, tmp_path, reference
):
    out = tmp_path / "two"
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        "2",
        "--cpu",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the reference ran with one thread: same kernels, same bits
    res = subprocess.run(
        [*launch, "-m", "acchead.data_gen.cli", *base_args(tiny_pair_dirs, prompts_file, out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    rows, feats, cfg = read_run(out)
    assert rows == reference[0] and np.array_equal(feats, reference[1]) and cfg == reference[2]


def test_refuses_a_different_runs_output(tiny_pair_dirs, prompts_file, tmp_path, reference, capsys):
    out = tmp_path / "ref"  # the reference's directory
    before = (out / "gen_config.json").read_text()
    assert cli.main(base_args(tiny_pair_dirs, prompts_file, out, "--seed", "1")) == 2
    err = capsys.readouterr().err
    assert "different gen-data run" in err and "seed" in err and "Traceback" not in err
    assert (out / "gen_config.json").read_text() == before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "thesis.txt").write_text("precious")
    assert cli.main(base_args(tiny_pair_dirs, prompts_file, other)) == 2
    assert "holds no gen-data run" in capsys.readouterr().err and (other / "thesis.txt").exists()


def test_tokenizer_mismatch_is_one_line_error(tiny_pair_dirs, prompts_file, tmp_path, capsys):
    draft = tmp_path / "draft_other_tok"
    shutil.copytree(tiny_pair_dirs[1], draft)
    for f in draft.glob("tokenizer*"):
        f.unlink()
    make_tiny_tokenizer(vocab_size=300).save_pretrained(draft)  # another vocabulary: ids mean other tokens
    assert cli.main(base_args((tiny_pair_dirs[0], draft), prompts_file, tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert "tokenizers differ" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_wider_than_the_models_is_one_line_error(prompts_file, tmp_path, capsys):
    """Prompt ids past the models' embedding tables (a tokenizer that does not fit them) are refused in one
    line before any labelling (an IndexError inside the target's forward, with a traceback, before)."""
    from conftest import make_tiny_llama

    pair = []
    for name, hidden, seed in (("target", 32, 1), ("draft", 16, 2)):
        make_tiny_llama(64, hidden_size=hidden, num_layers=1, seed=seed).save_pretrained(tmp_path / name)
        make_tiny_tokenizer().save_pretrained(tmp_path / name)  # 320 ids for 64 embedding rows
        pair.append(tmp_path / name)
    capsys.readouterr()  # (saving's progress bars)
    assert cli.main(base_args(pair, prompts_file, tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip()
    assert "outside the models' embedding tables (ids 0..63)" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ('{"text": "def f():"}\n', ".jsonl", "no prompt field 'prompt'"),
        ('{"prompt": "def f():"}\n{"prompt": "  "}\n', ".jsonl", "prompt 1 of"),
        ("", ".jsonl", "no prompts"),
        ('{"prompt": "def f():"\n', ".jsonl", "not valid JSON"),
        (b"\xff\xfe\x00bad", ".txt", "not UTF-8"),
        (b"PAR1 not really parquet", ".parquet", "cannot read"),
        ("a prompt", ".csv", "unknown prompt file type"),
        (None, ".jsonl", "not found"),
    ],
    ids=[
        "unknown-field",
        "empty-prompt",
        "no-prompts",
        "bad-json",
        "not-utf8",
        "bad-parquet",
        "csv",
        "missing",
    ],
)
def test_bad_prompt_input_is_one_line_error(tiny_pair_dirs, tmp_path, capsys, content, suffix, message):
    path = tmp_path / f"prompts{suffix}"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert cli.main(base_args(tiny_pair_dirs, path, tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_prompts_longer_than_the_context_are_skipped_with_a_count(tiny_pair_dirs, tmp_path, capsys):
    # The tiny models have a 256-token context; this prompt leaves no room for 8 new tokens.
    long = "def g(x):\n    return " + " + ".join(f"x{i}" for i in range(200))
    path = write_jsonl(tmp_path / "p.jsonl", [PROMPTS[0], long, PROMPTS[1]])
    out = tmp_path / "out"
    assert cli.main(base_args(tiny_pair_dirs, path, out)) == 0
    assert "skipping 1 prompts too long" in capsys.readouterr().err
    rows, _, cfg = read_run(out)
    assert rows["prompt_index"] == [0, 2] and cfg["prompts"]["skipped_too_long"] == 1
    only_long = write_jsonl(tmp_path / "long.jsonl", [long])
    assert cli.main(base_args(tiny_pair_dirs, only_long, tmp_path / "out2")) == 2
    assert "no room" in capsys.readouterr().err


def test_shipped_yaml_loads_and_every_key_is_a_commented_flag():
    path = config_path("gen_data")
    cfg = yaml.safe_load(path.read_text())
    dests = {a.dest for a in build_parser()._actions}
    assert set(cfg) <= dests
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert " # " in line, f"uncommented key: {line}"
    args = parse_args([])
    assert args.source.kind == "builtin" and args.source.name == "stdlib-functions"
    assert args.target is None and args.cache_features == "auto"
    # r = auto: the measured default per S
    assert args.mix_ratio == DEFAULT_MIX_RATIO["greedy" if args.sampling.greedy else "sampling"]
    assert parse_args(["--temperature", "0"]).mix_ratio == DEFAULT_MIX_RATIO["greedy"]
    assert parse_args(["--temperature", "1", "--top-k", "50"]).mix_ratio == DEFAULT_MIX_RATIO["sampling"]
    assert parse_args(["--mix-ratio", "0.15"]).mix_ratio == 0.15
    with pytest.raises(AccheadError, match="'auto'"):
        parse_args(["--mix-ratio", "half"])


def test_flags_override_the_config_file(tmp_path):
    custom = tmp_path / "c.yaml"
    custom.write_text("prompt_set: humaneval\nmix_ratio: 0.3\nseed: 5\nout: somewhere\ntemperature: 0.6\n")
    args = parse_args(["--config", str(custom), "--seed", "7", "--prompts", "p.jsonl", "--top-p", "0.9"])
    assert args.seed == 7 and args.mix_ratio == 0.3 and str(args.out) == "somewhere"
    assert args.source.kind == "file" and args.source.name == "p.jsonl"  # the command line picks the source
    assert (args.sampling.temperature, args.sampling.top_p) == (0.6, 0.9)
    custom.write_text("mix_ratio: 0.3\nmix_ration: 0.2\n")
    with pytest.raises(Exception, match="unknown key"):
        parse_args(["--config", str(custom)])
    with pytest.raises(Exception, match="mix_ratio"):
        parse_args(["--mix-ratio", "1.5"])


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("overwrite: 'false'\n", "overwrite must be true or false, got 'false'"),  # bool() said True
        ("chat_template: 'no'\n", "chat_template must be true or false"),
        ("max_new_tokens: true\n", "max_new_tokens must be an integer, got True"),  # int(True) said 1
        ("batch_size: 2.7\n", "batch_size must be an integer, got 2.7"),  # int() said 2
        ("max_new_tokens: abc\n", "max_new_tokens must be an integer"),  # a traceback before
        ("seed: [1, 2]\n", "seed must be an integer"),
        ("temperature: hot\n", "temperature must be a number"),
        ("feature_chain: 0\n", "feature_chain=0"),  # `or 1` read 0 as 1
    ],
)
def test_a_config_value_of_the_wrong_type_is_one_line_naming_its_key(tmp_path, yaml_text, message):
    custom = tmp_path / "c.yaml"
    custom.write_text(yaml_text)
    with pytest.raises(AccheadError, match="^" if "=" in message else str(custom)) as e:
        parse_args(["--config", str(custom), "--out", str(tmp_path / "out")])
    assert message in str(e.value)
    ok = tmp_path / "ok.yaml"  # the forms the shipped file and users write: ints for floats, auto, bools
    ok.write_text("temperature: 1\ntop_p: 1\nmix_ratio: 1\ncache_features: false\noverwrite: true\n")
    args = parse_args(["--config", str(ok), "--out", str(tmp_path / "out")])
    assert (args.sampling.temperature, args.mix_ratio) == (1.0, 1.0)
    assert (args.cache_features, args.overwrite) == ("off", True)


def test_paths_that_would_lose_work_are_refused_before_it(tmp_path):
    """--emit-responses at a directory or under a missing one (found only after labelling before), and an
    --out that holds an input (`--overwrite` would delete it)."""
    (tmp_path / "adir").mkdir()
    for path in (tmp_path / "adir", tmp_path / "missing" / "r.jsonl"):
        with pytest.raises(AccheadError, match="--emit-responses"):
            parse_args(["--out", str(tmp_path / "out"), "--emit-responses", str(path)])
    prompts = tmp_path / "runs" / "p.jsonl"
    prompts.parent.mkdir()
    prompts.write_text('{"prompt": "x"}\n')
    for out in (prompts.parent, prompts):
        with pytest.raises(AccheadError, match="holds the input --prompts"):
            parse_args(["--out", str(out), "--prompts", str(prompts), "--overwrite"])
    assert parse_args(["--out", str(tmp_path / "out"), "--prompts", str(prompts)]).out == tmp_path / "out"
