"""`acchead.errors`: the shared bounded-int argparse types, and `--threads` on every command that takes it."""

from __future__ import annotations

import argparse
import importlib

import pytest

from acchead.errors import int_at_least, thread_count


def test_int_at_least_says_its_bound():
    positive = int_at_least(1)
    assert positive("1") == 1
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be >= 1, got 0$"):
        positive("0")


def test_thread_count_takes_zero_and_up():
    assert thread_count("0") == 0 and thread_count("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be >= 0 \(0: torch's default\), got -1"):
        thread_count("-1")
    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer, got 'two'"):
        thread_count("two")


# (module, the arguments before --threads): every parser whose --threads reaches torch.set_num_threads
# (acchead-train checks its own: `TrainSettings`, ">= 1")
COMMANDS = [
    ("acchead.inference.bench.run", []),
    ("acchead.inference.bench.gpu_check", []),
    ("acchead.inference.bench.hf_custom", []),
    ("acchead.zoo.build", []),
    ("acchead.data_gen.bench_overhead", []),
    ("acchead.distill.cli", ["train"]),
]


@pytest.mark.parametrize(("module", "before"), COMMANDS, ids=[m for m, _ in COMMANDS])
def test_a_negative_thread_count_is_refused_before_any_work(module, before, capsys):
    """Before, a negative count ran on torch's default threads (bench, gpu-check, hf_custom, build-zoo) or
    reached torch.set_num_threads, whose RuntimeError is a traceback (bench_overhead, distill)."""
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_info:
        main([*before, "--threads", "-1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("error: argument --threads: must be >= 0 (0: torch's default), got -1"), err
