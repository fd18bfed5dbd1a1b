"""The refusal of a config file that is not there names the configs that are
(``adaqp.cli.configs.missing_config``): the working folder's ``configs/``, else the
checkout's."""

from __future__ import annotations

from pathlib import Path

from adaqp.cli.configs import config_files, missing_config

CHECKOUT_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_working_folders_configs_are_listed_as_paths_to_type(tmp_path):
    (tmp_path / "configs").mkdir()
    for name in ("b.toml", "a.toml", "notes.md"):
        (tmp_path / "configs" / name).write_text("")
    assert config_files(tmp_path) == ("configs", ["a.toml", "b.toml"])
    assert missing_config("nope.toml", tmp_path) == (
        "config file nope.toml not found; the configs here: configs/a.toml, configs/b.toml"
    )


def test_elsewhere_the_checkouts_configs_are_listed_with_their_folder(tmp_path):
    names = sorted(p.name for p in CHECKOUT_CONFIGS.glob("*.toml"))
    assert "cora-gcn.toml" in names
    assert config_files(tmp_path) == (str(CHECKOUT_CONFIGS), names)
    assert missing_config(tmp_path / "x.toml", tmp_path) == (
        f"config file {tmp_path / 'x.toml'} not found; the configs in {CHECKOUT_CONFIGS}/: "
        + ", ".join(names)
    )


def test_a_folder_is_not_a_config_file(tmp_path):
    assert missing_config(tmp_path, tmp_path) == f"config file {tmp_path} is not a regular file"
