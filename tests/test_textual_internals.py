"""`gpuanat.tui.textual_internals`, the one module that uses Textual's private names: on the Textual it was written
against it installs its compositor patches; on any other it leaves Textual as it is, and the keymap's key names come
from the public tables."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import textual

from gpuanat.tui import textual_internals
from gpuanat.tui.textual_internals import WRITTEN_AGAINST, character_to_key, written_for


def test_the_installed_textual_is_the_one_written_against():
    """The `test` extra pins it: the snapshots and the patches need it."""
    assert textual.__version__ == WRITTEN_AGAINST and written_for(textual.__version__)


@pytest.mark.parametrize("version", ["8.2.7", "8.3.0", "9.0.0", "8.2.8.dev1", ""])
def test_another_version_is_not_the_one_written_against(version):
    assert not written_for(version)


def _installed_after(version: str) -> dict:
    """In a fresh interpreter (where nothing is patched yet): what `install_partial_updates(version)` returns, and
    whether Textual's compositor methods are then Textual's own."""
    code = textwrap.dedent(
        f"""
        import json
        from textual._compositor import ChopsUpdate, Compositor
        own_segments, own_chops = ChopsUpdate.render_segments, Compositor._render_chops
        from gpuanat.tui import textual_internals
        installed = textual_internals.install_partial_updates({version!r})
        print(json.dumps({{
            "installed": installed,
            "own_segments": ChopsUpdate.render_segments is own_segments,
            "own_chops": Compositor._render_chops is own_chops,
        }}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_on_another_textual_the_compositor_is_left_as_it_is():
    assert _installed_after("9.0.0") == {"installed": False, "own_segments": True, "own_chops": True}


def test_on_the_textual_written_against_both_patches_are_installed():
    assert _installed_after(WRITTEN_AGAINST) == {"installed": True, "own_segments": False, "own_chops": False}


def test_importing_the_module_patches_nothing():
    """Only the dashboards' App installs the patches, when it is built."""
    code = (
        "from textual._compositor import Compositor; own = Compositor._render_chops; "
        "import gpuanat.tui.textual_internals, gpuanat.tui.widgets.line_chart; "
        "print(Compositor._render_chops is own)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "True"


@pytest.mark.parametrize("character", [*"+-=?!@#$%^&*()[]{}<>/\\|~`'\",.;: _", "a", "Z", "4", "é", "€"])
def test_the_key_names_without_textuals_private_table_are_textuals(character):
    """On a Textual without its private `_character_to_key`, `character_to_key` names keys from the public tables
    as 8.2.8 did: the same names as Textual's own, which it uses here."""
    assert textual_internals.character_to_key_from_public_tables(character) == character_to_key(character)
