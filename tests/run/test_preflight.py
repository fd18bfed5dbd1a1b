"""The checks before a run starts: its output folder, its partition folder; nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaqp.config import load_config
from adaqp.run.placement import Placement
from adaqp.run.preflight import Refusal, check
from adaqp.run.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]
CORA = ROOT / "configs" / "cora-gcn.toml"


def _config(tmp_path: Path, *overrides: str):
    return load_config(CORA, [f"partition.dir={tmp_path / 'parts'}", *overrides])


def _finished(out: Path) -> None:
    run = RunDir.claim(Placement(out))
    (out / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (out / "summary.json").write_text("{}\n")
    run.end()
    run.close()


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_named_out_holding_a_run_is_refused_unless_a_flag_says_what_to_do(tmp_path):
    out = tmp_path / "mine"
    _finished(out)
    config = _config(tmp_path, f"metrics.out={out}")
    with pytest.raises(Refusal, match="holds a finished run"):
        check(config, 4, Placement.of(config, 4))
    assert check(config, 4, Placement.of(config, 4, overwrite=True)) == out
    with pytest.raises(Refusal, match="no checkpoint"):
        check(config, 4, Placement.of(config, 4, resume=True))


def test_a_partition_folder_with_other_files_or_another_world_size_is_refused(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "notes.txt").write_text("mine\n")
    config = _config(tmp_path, f"metrics.out={tmp_path / 'out'}")
    with pytest.raises(Refusal, match="not an AdaQP partition"):
        check(config, 4, Placement.of(config, 4))
    assert _tree(tmp_path) == ["parts", "parts/notes.txt"]


@pytest.mark.slow
def test_a_partition_for_another_number_of_workers_is_refused(tmp_path):
    from adaqp.partitioning.build import ensure_partition

    config = _config(tmp_path, f"metrics.out={tmp_path / 'out'}")
    ensure_partition(config.data, config.partition, 2, tmp_path / "parts")
    assert check(config, 2, Placement.of(config, 2)) == tmp_path / "out"
    with pytest.raises(Refusal, match="2"):
        check(config, 4, Placement.of(config, 4))
    assert not (tmp_path / "out").exists()
