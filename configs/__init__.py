"""Shipped YAML configurations (one per command), installed as package data."""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent


def config_path(name: str) -> Path:
    """Path of the shipped config `name` (with or without the `.yaml` suffix)."""
    return CONFIG_DIR / (name if name.endswith(".yaml") else f"{name}.yaml")
