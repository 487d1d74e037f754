"""Key remapping from the user's config file, applied to the real app."""

from __future__ import annotations

import pytest

from gpuanat.core.config import RunConfig
from gpuanat.core.sampler import open_source
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.keymap import KeymapError, load_keymap

IDS = {"run", "batch_up", "quit"}


def test_missing_file_means_no_remapping(tmp_path):
    assert load_keymap(tmp_path / "config.toml", IDS) == {}


def test_keymap_table_is_read(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[keymap]\nrun = "f5"\nbatch_up = "u,plus"\n')
    assert load_keymap(path, IDS) == {"run": "f5", "batch_up": "u,plus"}


@pytest.mark.parametrize(("text", "words"), [
    ('[keymap]\nrnu = "f5"\n', "unknown binding id 'rnu'"),
    ("[keymap]\nrun = 5\n", "must map binding ids to key strings"),
    ("[keymap\n", "config.toml"),
])
def test_bad_config_says_where_and_why(tmp_path, text, words):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(KeymapError, match=words):
        load_keymap(path, IDS)


@pytest.mark.asyncio
async def test_a_remapped_key_drives_the_action(tmp_path):
    app = GpuAnatApp(RunConfig(preset="tiny", device="cpu"), db_path=tmp_path / "h.sqlite",
                     sampler_factory=lambda: open_source(prefer_nvml=False), keymap={"batch_up": "u"})
    async with app.run_test() as pilot:
        await pilot.press("u")
        assert app.config.batch_size == 8
        await pilot.press("plus")  # the default key no longer applies
        assert app.config.batch_size == 8
