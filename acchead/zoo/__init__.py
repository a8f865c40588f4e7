"""The embedded demo pair (pycode-draft, pycode-target), its shipped head, and named prompt sets."""

from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent
DRAFT_DIR = ZOO_DIR / "pycode-draft"
TARGET_DIR = ZOO_DIR / "pycode-target"
HEAD_PATH = ZOO_DIR / "pycode-head" / "head.safetensors"
