"""User key remapping: `[keymap]` in $XDG_CONFIG_HOME/gpuanat/config.toml maps binding ids to keys.

    [keymap]
    run = "f5"            # r -> F5
    batch_up = "ctrl+up,plus"

Binding ids are the ones in GpuAnatApp.BINDINGS.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path


class KeymapError(ValueError):
    """The config file cannot be used; the message says where and why."""


def default_config_path() -> Path:
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "gpuanat" / "config.toml"


def load_keymap(path: Path, known_ids: set[str]) -> dict[str, str]:
    """The [keymap] table of `path` (empty when the file does not exist)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise KeymapError(f"{path}: {error}") from error
    keymap = data.get("keymap", {})
    if not isinstance(keymap, dict) or not all(isinstance(value, str) for value in keymap.values()):
        raise KeymapError(f'{path}: [keymap] must map binding ids to key strings, e.g. run = "f5"')
    unknown = sorted(set(keymap) - known_ids)
    if unknown:
        known = ", ".join(sorted(known_ids))
        raise KeymapError(f"{path}: unknown binding id {unknown[0]!r} in [keymap]; known: {known}")
    return dict(keymap)
