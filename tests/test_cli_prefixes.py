"""Every command refuses a prefix of an option (argparse's ``allow_abbrev``): ``--epoch 5``
ran as ``--epochs 5`` and ``--mod`` as ``--mode``, where a typo should be an error."""

from __future__ import annotations

import pytest

from adaqp import plot, train
from adaqp.bench.__main__ import BENCHMARKS
from adaqp.bench.__main__ import build_parser as bench_parser
from adaqp.emulate.cli import build_parser as cluster_parser
from partition.__main__ import build_parser as partition_parser


def _refused(parse, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "prefix"), [(["--epoch", "5"], "--epoch"), (["--mod", "adaqp"], "--mod")]
)
def test_train_refuses_a_prefix(argv, prefix, capsys):
    assert f"unrecognized arguments: {prefix}" in _refused(train.parse_args, argv, capsys)
    assert train.parse_args([f"{argv[0]}{'s' if prefix == '--epoch' else 'e'}", argv[1]])


def test_plot_refuses_a_prefix(capsys):
    err = _refused(plot.parse_args, ["run", "--ou", "x.png"], capsys)
    assert "unrecognized arguments: --ou" in err


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_refuses_a_prefix(name, capsys):
    err = _refused(bench_parser(name).parse_args, [name, "--out-d", "x"], capsys)
    assert "unrecognized arguments: --out-d" in err
    assert bench_parser(name).parse_args([name, "--out-dir", "x"]).out_dir.name == "x"


def test_cluster_refuses_a_prefix(capsys):
    err = _refused(cluster_parser().parse_args, ["--host", "2"], capsys)
    assert "unrecognized arguments: --host" in err
    assert cluster_parser().parse_args(["--hosts", "2"]).hosts == 2


def test_partition_refuses_a_prefix(capsys):
    argv = ["--num-parts", "2", "--out", "p"]
    err = _refused(partition_parser().parse_args, [*argv, "--forc"], capsys)
    assert "unrecognized arguments: --forc" in err
    assert partition_parser().parse_args([*argv, "--force"]).force
