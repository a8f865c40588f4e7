"""head.safetensors: round trip, refusing heads of other drafts, refusing files that are not heads."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_tiny_llama
from safetensors.torch import save_file

import acchead
from acchead.errors import AccheadError
from acchead.head_io import HEAD_FILENAME, HeadMetadata, load_head, save_head
from acchead.models import model_identity
from acchead.sampling import SamplingConfig


def _meta(head: acchead.AcceptanceHead, draft: dict, **kw) -> HeadMetadata:
    return HeadMetadata(
        depth=head.depth, hidden_size=head.hidden_size, w_acc=1.0, w_rej=6.0, draft=draft,
        sampling=SamplingConfig(0.6, 0, 0.9).to_dict(), data={"mix_ratio": 0.15, "rows": 12},
        extra={"val_kl": 0.123}, **kw,
    )


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_public_names():
    names = {"AcceptanceHead", "save_head", "load_head", "HeadMetadata", "SamplingConfig", "AccheadError"}
    assert names <= set(acchead.__all__) and all(hasattr(acchead, n) for n in names)


def test_round_trip(tmp_path, tiny_llama_pair):
    _, draft = tiny_llama_pair
    head = acchead.AcceptanceHead(32, 3).train()
    meta = _meta(head, model_identity(draft))
    path = save_head(head, tmp_path / "out" / HEAD_FILENAME, meta=meta)
    assert sorted(p.name for p in path.parent.iterdir()) == [HEAD_FILENAME]  # no temp file left behind

    loaded, loaded_meta = load_head(path, draft=draft)
    assert loaded_meta == meta
    assert loaded_meta.sampling_config == SamplingConfig(0.6, 0, 0.9)
    assert not loaded.training and loaded.depth == 3
    for (k, v), (k2, v2) in zip(head.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)
    x = torch.randn(4, 32)
    torch.testing.assert_close(loaded(x), head.eval()(x))
    # A directory holding head.safetensors works too, as does an identity dict instead of the model.
    load_head(path.parent, draft=model_identity(draft))


def test_save_overwrites_atomically(tmp_path):
    head = acchead.AcceptanceHead(8, 1)
    ident = {"name": "d", "hidden_size": 8, "vocab_size": 10, "fingerprint": "abc"}
    path = save_head(head, tmp_path / "h.safetensors", meta=_meta(head, ident))
    head2 = acchead.AcceptanceHead(8, 0)
    save_head(head2, path, meta=_meta(head2, ident))
    assert load_head(path)[1].depth == 0


def test_save_refuses_metadata_that_does_not_describe_the_head(tmp_path):
    head = acchead.AcceptanceHead(8, 2)
    ident = {"name": "d", "hidden_size": 8, "vocab_size": 10, "fingerprint": "abc"}
    with pytest.raises(ValueError, match="depth"):
        save_head(head, tmp_path / "h.safetensors", meta=HeadMetadata(1, 8, 1.0, 1.0, ident, {}))
    with pytest.raises(ValueError, match="draft hidden size"):
        save_head(head, tmp_path / "h.safetensors", meta=_meta(head, {**ident, "hidden_size": 16}))
    assert not (tmp_path / "h.safetensors").exists()


def test_head_for_another_draft_is_refused(tmp_path, tiny_llama_pair, tiny_tokenizer):
    target, draft = tiny_llama_pair
    head = acchead.AcceptanceHead(32, 1)
    path = save_head(head, tmp_path / HEAD_FILENAME, meta=_meta(head, model_identity(draft)))
    with pytest.raises(AccheadError, match=r"hidden size 32.*hidden size 64") as e:
        load_head(path, draft=target)
    _one_line(e)
    # Same architecture, other weights: caught by the fingerprint, and both fingerprints are named.
    sibling = make_tiny_llama(len(tiny_tokenizer), 32, 2, seed=99, eos_token_id=tiny_tokenizer.eos_token_id)
    with pytest.raises(AccheadError, match="fingerprint") as e:
        load_head(path, draft=sibling)
    msg = _one_line(e)
    assert model_identity(draft)["fingerprint"] in msg and model_identity(sibling)["fingerprint"] in msg


def test_files_that_are_not_heads(tmp_path):
    with pytest.raises(AccheadError, match="does not exist") as e:
        load_head(tmp_path / "missing.safetensors")
    _one_line(e)
    with pytest.raises(AccheadError, match="directory without") as e:
        load_head(tmp_path)
    _one_line(e)

    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(AccheadError, match="not an acchead head file") as e:
        load_head(junk)
    _one_line(e)

    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain), metadata={"format": "pt"})
    with pytest.raises(AccheadError, match="not an acchead head") as e:
        load_head(plain)
    _one_line(e)


def _rewrite(path, **metadata_updates):
    """Copy a head file with some metadata entries replaced (for corrupt-file tests)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        metadata = {**f.metadata(), **metadata_updates}
    save_file(tensors, str(path), metadata=metadata)


def test_corrupt_or_future_heads(tmp_path):
    head = acchead.AcceptanceHead(8, 1)
    ident = {"name": "d", "hidden_size": 8, "vocab_size": 10, "fingerprint": "abc"}
    path = save_head(head, tmp_path / HEAD_FILENAME, meta=_meta(head, ident))
    good = json.loads(load_head(path)[1].to_json())

    _rewrite(path, version="2")
    with pytest.raises(AccheadError, match="version 2"):
        load_head(path)
    _rewrite(path, version="1", acchead_meta=json.dumps({**good, "depth": 2}))  # weights of depth 1
    with pytest.raises(AccheadError, match="corrupt") as e:
        load_head(path)
    _one_line(e)
    _rewrite(path, acchead_meta="{not json")
    with pytest.raises(AccheadError, match="corrupt"):
        load_head(path)
