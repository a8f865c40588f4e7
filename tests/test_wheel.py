"""A plain wheel install: one top-level package, every shipped file, every console script answers --help.

The wheel is built from a copy of the tracked sources (`pip wheel --no-deps --no-build-isolation`: no
network, the current environment's setuptools) and installed with `--no-deps` into a fresh venv that sees
the current environment's site-packages (torch, transformers, ...) but not this checkout. Slow: the build
takes seconds, the scripts' --help tens of seconds (each imports torch).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_layout import PACKAGE_DIR, PACKAGES, PYPROJECT, REPO, package_folder

pytestmark = pytest.mark.slow

NAME = PYPROJECT["project"]["name"]
VERSION = PYPROJECT["project"]["version"]
DIST_INFO = f"{NAME}-{VERSION}.dist-info"
SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]
SOURCE_FOLDERS = sorted({"acchead", *PACKAGE_DIR.values()})  # the folders the build reads


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(cmd: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{tail}"
    return proc


def tracked_sources() -> list[str]:
    """Repository-relative files the build reads: pyproject, README and the package folders' files.

    Tracked files when this is a git checkout (so local scratch files do not count), else every file
    outside __pycache__.
    """
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", *SOURCE_FOLDERS], cwd=REPO, capture_output=True, check=True
        ).stdout.decode()
        files = [f for f in out.split("\0") if f and (REPO / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [
            str(p.relative_to(REPO))
            for folder in SOURCE_FOLDERS
            for p in (REPO / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
    return ["pyproject.toml", "README.md", *sorted(files)]


def installed_path(rel: str) -> str | None:
    """Where repository file `rel` lands in the wheel: under its innermost package (None: in no package)."""
    path = REPO / rel
    owners = [p for p in PACKAGES if package_folder(p) in path.parents]
    if not owners:
        return None
    package = max(owners, key=lambda p: len(package_folder(p).parts))
    return "/".join([*package.split("."), *path.relative_to(package_folder(package)).parts])


def current_site_dirs() -> list[str]:
    """The current interpreter's site-packages directories (also `make`'s .venv inside this checkout)."""
    out = []
    for entry in sys.path:
        path = Path(entry or ".").resolve()
        if path.name in ("site-packages", "dist-packages") and path.is_dir():
            out.append(str(path))
    return list(dict.fromkeys(out))


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel file, venv python): the wheel built from a copy of the sources, installed in a fresh venv."""
    try:  # without build isolation, the current setuptools builds the wheel: bdist_wheel is its own from 70.1
        import wheel
    except ImportError:
        pytest.importorskip("setuptools", minversion="70.1")
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    for rel in tracked_sources():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    dist = root / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
          "-w", dist, src], cwd=root)
    (wheel,) = dist.glob("*.whl")

    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], cwd=root)
    python = venv / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root)
    # Beside the current site-packages (a venv's --system-site-packages reaches only the base interpreter's):
    # listed after the venv's own, and without running their .pth files, so an editable install of this
    # checkout stays invisible.
    Path(purelib.stdout.strip(), "zz_current_env.pth").write_text("\n".join(current_site_dirs()) + "\n")
    _run([python, "-m", "pip", "install", "--no-deps", "--ignore-installed", "--no-index", wheel], cwd=root)
    return wheel, python


def test_wheel_holds_one_top_level_package_and_every_shipped_file(wheel_venv):
    wheel, _ = wheel_venv
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"acchead", DIST_INFO}
    top_level = zipfile.ZipFile(wheel).read(f"{DIST_INFO}/top_level.txt").decode().split()
    assert top_level == ["acchead"]
    expected = {installed_path(rel) for rel in tracked_sources()} - {None}
    missing = sorted(expected - set(names))
    assert not missing, f"tracked files the wheel lacks (package-data in pyproject.toml?): {missing}"


def test_installed_package_imports_from_the_venv_only(wheel_venv, tmp_path):
    _, python = wheel_venv
    code = (
        "import importlib, importlib.util, sys\n"
        "import acchead\n"
        f"for m in {sorted(PACKAGES)!r}:\n"
        "    mod = importlib.import_module(m)\n"
        "    assert mod.__file__.startswith(sys.prefix), (m, mod.__file__, sys.prefix)\n"
        "from acchead.configs import config_path\n"
        "assert all(config_path(n).is_file() for n in ('gen_data', 'train', 'bench'))\n"
        "from acchead.zoo import fallback_head\n"
        "assert fallback_head().is_file()\n"
        "for old in ('data_gen', 'train', 'inference', 'configs'):\n"
        "    spec = importlib.util.find_spec(old)\n"
        "    assert spec is None or not (spec.origin or '').startswith(sys.prefix), (old, spec)\n"
        "print('ok')\n"
    )
    assert _run([python, "-c", code], cwd=tmp_path).stdout.strip() == "ok"


def test_installed_record_has_one_top_level_package(wheel_venv):
    _, python = wheel_venv
    code = (
        "import importlib.metadata as md, sys\n"
        f"dist = next(d for d in md.distributions(path=[p for p in sys.path if p.startswith(sys.prefix)])"
        f" if d.metadata['Name'] == {NAME!r})\n"
        "print('\\n'.join(str(f) for f in dist.files))\n"
    )
    files = _run([python, "-c", code], cwd=python.parent).stdout.split()
    tops = {f.split("/")[0] for f in files if not f.startswith("..")}  # ../../../bin/<script>
    assert tops == {"acchead", DIST_INFO}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_console_script_answers_help(wheel_venv, script, tmp_path):
    _, python = wheel_venv
    exe = python.parent / script
    assert exe.is_file(), f"{script} was not installed"
    out = _run([exe, "--help"], cwd=tmp_path, timeout=300)
    assert "usage:" in out.stdout.lower(), out.stdout[:500]
