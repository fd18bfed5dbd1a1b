"""A partition made for another number of parts, graph or parameters is refused with the
way out that fits the caller: ``--force`` for ``python -m partition``, another worker
count, deleting the directory or another ``partition.dir`` for a training run."""

from __future__ import annotations

import pytest

from adaqp.config import load_config
from adaqp.partitioning import schema
from adaqp.partitioning.build import ensure_partition
from partition.__main__ import main as partition_main


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A 2-part Cora partition and the config that made it."""
    out = tmp_path_factory.mktemp("refusals") / "cora2"
    config = load_config(None, ["data.dataset=cora"])
    ensure_partition(config.data, config.partition, 2, out)
    return out, config


def _refusal(made, num_parts: int, overrides: list[str], *, tool: bool) -> str:
    out, _ = made
    config = load_config(None, ["data.dataset=cora", *overrides])
    with pytest.raises(schema.PartitionError) as info:
        ensure_partition(config.data, config.partition, num_parts, out, tool=tool)
    return str(info.value)


@pytest.mark.parametrize(
    ("num_parts", "overrides", "what"),
    [
        (4, [], "has 2 parts but the world size is 4; launch 2 workers, or delete"),
        (2, ["partition.method=random"], "was made with"),
        (2, ["data.split_seed=7"], "made from dataset"),
        (2, ["data.feature_norm=row"], "made from dataset"),
    ],
    ids=["parts", "params", "dataset", "feature-norm"],
)
def test_training_path_says_delete_it_or_set_partition_dir(made, num_parts, overrides, what):
    message = _refusal(made, num_parts, overrides, tool=False)  # as adaqp.train's rank 0
    assert what in message
    assert num_parts != 2 or "this run asks for" in message
    assert f"delete {made[0]}" in message and "--set partition.dir=DIR" in message
    assert "--force" not in message  # adaqp.train has no such flag


@pytest.mark.parametrize(
    ("num_parts", "overrides", "what"),
    [
        (4, [], "has 2 parts, not the 4 asked for"),
        (2, ["partition.seed=3"], "was made with"),
        (2, ["data.split_seed=7"], "made from dataset"),
        (2, ["data.feature_norm=row"], "made from dataset"),
    ],
    ids=["parts", "params", "dataset", "feature-norm"],
)
def test_partition_tool_says_pass_force(made, num_parts, overrides, what):
    message = _refusal(made, num_parts, overrides, tool=True)
    assert what in message and "pass --force to re-create it" in message
    assert "world size" not in message and "partition.dir" not in message


def test_every_rank_check_gives_the_training_message(made):
    """``adaqp.train`` checks the partition on every rank with ``check_matches``."""
    out, config = made
    meta = schema.read_metadata(out)
    with pytest.raises(schema.PartitionError, match="launch 2 workers, or delete") as info:
        schema.check_matches(
            meta,
            out,
            spec=config.data.spec(),
            num_parts=3,
            method="metis",
            seed=0,
            balance_train=True,
            objective="cut",
        )
    assert "partition.dir" in str(info.value)


def test_command_line_refuses_another_part_count_until_forced(tmp_path, capsys):
    out = str(tmp_path / "cora")
    assert partition_main(["--dataset", "cora", "--num-parts", "2", "--out", out]) == 0
    capsys.readouterr()
    assert partition_main(["--dataset", "cora", "--num-parts", "3", "--out", out]) == 2
    err = capsys.readouterr().err
    assert f"partition {out} has 2 parts, not the 3 asked for; pass --force" in err
    assert schema.read_metadata(out)["params"]["num_parts"] == 2  # untouched
    argv = ["--dataset", "cora", "--num-parts", "3", "--out", out, "--force"]
    assert partition_main(argv) == 0
    assert schema.read_metadata(out)["params"]["num_parts"] == 3
    assert partition_main(["--dataset", "cora", "--num-parts", "3", "--out", out]) == 0  # reused
