"""Every command refuses a prefix of an option (argparse's ``allow_abbrev``): ``--epoch 5``
ran as ``--epochs 5`` and ``--mod`` as ``--mode``, where a typo should be an error. The
error names the option meant (``adaqp.cli.parser.Parser``), and a ``--set`` item without
``=`` is refused as such, not as a stray argument or a config file."""

from __future__ import annotations

import pytest

from adaqp import plot, train
from adaqp.bench.__main__ import BENCHMARKS
from adaqp.bench.__main__ import build_parser as bench_parser
from adaqp.emulate.cli import build_parser as cluster_parser
from adaqp.memory.__main__ import build_parser as memory_parser
from adaqp.ogb_fixture import build_parser as ogb_fixture_parser
from partition.__main__ import build_parser as partition_parser


def _refused(parse, argv: list[str], capsys) -> str:
    """The one error line of a refused command line (after argparse's usage)."""
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "prefix"), [(["--epoch", "5"], "--epoch"), (["--mod", "adaqp"], "--mod")]
)
def test_train_refuses_a_prefix(argv, prefix, capsys):
    err = _refused(train.parse_args, argv, capsys)
    meant = f"{argv[0]}{'s' if prefix == '--epoch' else 'e'}"
    assert err.endswith(f"unrecognized arguments: {' '.join(argv)}; did you mean {meant}?")
    assert train.parse_args([f"{argv[0]}{'s' if prefix == '--epoch' else 'e'}", argv[1]])


def test_plot_refuses_a_prefix(capsys):
    err = _refused(plot.parse_args, ["run", "--ou", "x.png"], capsys)
    assert err.endswith("unrecognized arguments: --ou x.png; did you mean --out?")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_refuses_a_prefix(name, capsys):
    err = _refused(bench_parser(name).parse_args, [name, "--out-d", "x"], capsys)
    # The benchmark's own option, though the top parser reports the unknown word.
    assert err.endswith("unrecognized arguments: --out-d x; did you mean --out-dir?")
    assert bench_parser(name).parse_args([name, "--out-dir", "x"]).out_dir.name == "x"


def test_cluster_refuses_a_prefix(capsys):
    err = _refused(cluster_parser().parse_args, ["--host", "2"], capsys)
    assert err.endswith("unrecognized arguments: --host 2; did you mean --hosts?")
    assert cluster_parser().parse_args(["--hosts", "2"]).hosts == 2


def test_partition_refuses_a_prefix(capsys):
    argv = ["--num-parts", "2", "--out", "p"]
    err = _refused(partition_parser().parse_args, [*argv, "--forc"], capsys)
    assert err.endswith("unrecognized arguments: --forc; did you mean --force?")
    assert partition_parser().parse_args([*argv, "--force"]).force


def test_memory_and_ogb_fixture_name_the_option_meant(capsys):
    argv = ["--config", "c.toml", "--nproc", "2", "--halo-per-iner", "1"]
    err = _refused(memory_parser().parse_args, argv, capsys)
    assert err.endswith("; did you mean --halo-per-inner?")
    err = _refused(ogb_fixture_parser().parse_args, ["--root", "r", "--nam", "x"], capsys)
    assert err.endswith("unrecognized arguments: --nam x; did you mean --name?")


def test_a_word_close_to_no_option_gets_no_guess(capsys):
    err = _refused(train.parse_args, ["--frobnicate", "3"], capsys)
    assert err == "adaqp.train: error: unrecognized arguments: --frobnicate 3"


SET_PARSERS = {
    "train": (train.parse_args, []),
    "memory": (memory_parser().parse_args, ["--config", "c.toml", "--nproc", "2"]),
    "partition": (partition_parser().parse_args, ["--num-parts", "2", "--out", "p"]),
    "ogb_fixture": (ogb_fixture_parser().parse_args, ["--root", "r"]),
}


@pytest.mark.parametrize("name", SET_PARSERS)
def test_a_set_item_without_equals_says_so(name, capsys):
    """``--set model.hidden 128`` used to end in "unrecognized arguments: 128" (or, in the
    launcher, "config file 128 not found")."""
    parse, required = SET_PARSERS[name]
    err = _refused(parse, [*required, "--set", "model.hidden", "128"], capsys)
    assert err.endswith(
        '--set takes KEY=VALUE: "model.hidden" has no "="; did you mean --set model.hidden=128?'
    )
    err = _refused(parse, [*required, "--set=model.hidden"], capsys)
    assert err.endswith("did you mean --set model.hidden=VALUE?")
    assert parse([*required, "--set", "model.hidden=128"]).set == ["model.hidden=128"]
