"""``summary.json`` and ``metrics.jsonl``: assembled in one place, no field ever lost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from adaqp.config import load_config
from adaqp.run.metrics import LEGACY_RECORD_NAMES, EpochRecord
from adaqp.run.summary import Outcome, RunFacts, settled_records, summarize
from tests.distributed import QUANTIZED, run_workers

ROOT = Path(__file__).resolve().parents[2]
CORA_CONFIG = ROOT / "configs" / "cora-gcn.toml"
MODES = ("vanilla", "adaqp-q", "adaqp-p", "adaqp", "adaqp-s", "onebit", "nocomm")

# Every field summary.json and metrics.jsonl had before the layout change. Checks outside
# the suite read them: a field may be added, never renamed or removed.
SUMMARY_KEYS = {
    "allreduce_time_s", "avg_bits", "best_epoch", "best_val_acc", "bits_histogram",
    "cache_input_halo", "calibrated_exchange_s_by_tag", "comm_time_s", "comm_wait_s",
    "cost_calibration", "dataset", "dequant_time_s", "edge_cut", "epoch_time_s", "epochs",
    "epochs_redone", "exchange_after_arrival_s_by_tag", "exchange_span_s_by_tag",
    "fabric_Bps", "final_train_loss", "halo_bytes_by_tag", "halo_bytes_per_epoch",
    "hidden_comm_fraction", "hidden_comm_fraction_by_tag", "host_of_rank",
    "input_cache_bytes", "max_staleness", "metric", "mode", "model", "partition_dir",
    "peak_memory_mb", "plan_bits_by_pair", "predicted_exchange_s_by_tag", "quant_scheme",
    "quant_time_s", "restarts", "resumed_from_epoch", "seed", "solver_time_s", "split_seed",
    "staleness_bound", "staleness_histogram", "test_acc", "total_time_s", "transform_first",
    "world_size",
}  # fmt: skip
RECORD_KEYS = {
    "allreduce_time_s", "assign_time_s", "avg_bits", "bytes_by_tag", "comm_time_s",
    "comm_wait_s", "dequant_time_s", "epoch", "epoch_time_s", "exchange_after_arrival_by_tag",
    "exchange_span_by_tag", "halo_bytes", "hidden_by_tag", "max_staleness", "quant_time_s",
    "staleness_by_tag", "test_acc", "train_acc", "train_loss", "val_acc", "values_by_bits",
    "wall_time_s",
}  # fmt: skip
ADDED_KEYS = {"cpu_time_s", "effective_staleness"}
"""Fields added since, in both files."""


def _record(epoch: int, **fields) -> EpochRecord:
    base = dict(
        epoch=epoch,
        train_loss=1.0 / epoch,
        epoch_time_s=0.1 * epoch,
        comm_time_s=0.04,
        comm_wait_s=0.01,
        allreduce_time_s=0.002,
        halo_bytes_per_epoch=1000 * epoch,
    )
    return EpochRecord(**{**base, **fields})


def _outcome(records, **fields) -> Outcome:
    base = dict(
        records=records,
        best_val_acc=0.7,
        best_epoch=2,
        test_acc_at_best_val=0.65,
        total_time_s=3.0,
        peak_memory_mb=12.0,
        input_cache_bytes=0,
        cache_input_halo=True,
        edge_cut=17,
        metric="acc",
    )
    return Outcome(**{**base, **fields})


def test_record_carries_its_earlier_names_and_reads_them_back():
    record = _record(3, bits_histogram={"2": 10}, solver_time_s=0.5)
    obj = record.to_json()
    assert set(obj) == RECORD_KEYS | ADDED_KEYS | set(LEGACY_RECORD_NAMES)
    assert obj["halo_bytes"] == obj["halo_bytes_per_epoch"] == 3000
    assert obj["values_by_bits"] == {"2": 10} and obj["assign_time_s"] == 0.5
    assert EpochRecord.from_json(obj) == record
    # A record a checkpoint saved before the renames holds only the earlier names.
    old = {k: v for k, v in obj.items() if k not in LEGACY_RECORD_NAMES}
    assert EpochRecord.from_json(old) == record


def test_summary_is_assembled_from_outcome_config_and_launcher_facts():
    config = load_config(
        CORA_CONFIG, ["comm.mode=adaqp", "quant.scheme=adaptive", "train.warmup_epochs=1"]
    )
    records = [
        _record(1, epoch_time_s=9.0, solver_time_s=0.25, bits_histogram={"8": 4}),
        _record(2, exchange_span_by_tag={"layer1/forward": 0.3}),
        _record(3, exchange_span_by_tag={"layer1/forward": 0.1}, bits_histogram={"2": 4}),
    ]
    facts = RunFacts(partition_dir="parts", restarts=1, resumed_from_epoch=2, epochs_redone=1)
    report = {"plan_bits_by_pair": {"0->1": 2.0}, "host_of_rank": [0, 0]}
    summary = summarize(config, 2, _outcome(records, plan_report=report), facts)
    assert summary.epoch_time_s == pytest.approx(0.25)  # median after the warm-up epoch
    assert summary.solver_time_s == 0.25 and summary.bits_histogram == {"2": 4}
    assert summary.halo_bytes_per_epoch == 3000  # the last epoch's
    # Epochs after the last re-solve (epoch 1): the median over epochs 2 and 3.
    assert summary.exchange_span_s_by_tag == {"layer1/forward": pytest.approx(0.2)}
    assert summary.partition_dir == "parts" and summary.restarts == 1
    assert summary.resumed_from_epoch == 2 and summary.epochs_redone == 1
    assert summary.plan_bits_by_pair == {"0->1": 2.0} and summary.quant_scheme == "adaptive"
    assert summary.hidden_comm_fraction == pytest.approx(0.75)
    obj = summary.to_json()
    assert set(obj) >= SUMMARY_KEYS
    assert obj["test_acc"] == obj["test_acc_at_best_val"] == summary.test_acc == 0.65


def test_effective_staleness_is_a_mean_over_every_read_of_the_run():
    config = load_config(CORA_CONFIG, ["comm.mode=onebit"])
    records = [
        _record(1, staleness_by_tag={"layer1/forward": {"0": 2}}),
        _record(2),  # no stale read (an adaqp-s epoch that left every exchange fresh)
        _record(
            3,
            staleness_by_tag={"layer1/forward": {"1": 4}, "layer1/backward": {"0": 1, "1": 1}},
            max_staleness=1,
            effective_staleness=3.0,
        ),
    ]
    summary = summarize(config, 2, _outcome(records), RunFacts())
    assert summary.effective_staleness == pytest.approx((2 * 0.0 + 6 * 3.0) / 8)
    assert summary.max_staleness == 1
    synchronous = summarize(config, 2, _outcome([_record(1), _record(2)]), RunFacts())
    assert synchronous.effective_staleness == 0.0


def test_settled_epochs_are_those_after_the_last_solve_that_ran():
    records = [_record(e, solver_time_s=0.1 if e in (2, 4) else 0.0) for e in range(1, 5)]
    # The solve after the final epoch (4) plans nothing that ran: epoch 2's plans count.
    assert [r.epoch for r in settled_records(records, warmup=1)] == [3, 4]
    unsolved = [_record(e) for e in range(1, 5)]
    assert [r.epoch for r in settled_records(unsolved, warmup=1)] == [2, 3, 4]


def _mode_worker(rank: int, world_size: int, init_method: str, overrides: tuple[str, ...]):
    from adaqp.run.job import run

    run(load_config(CORA_CONFIG, list(overrides)), init_method, rank, world_size)
    return {"done": np.array(1)}


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_writes_every_summary_and_metrics_field(tmp_path, mode):
    out = tmp_path / mode
    overrides = (
        f"comm.mode={mode}",
        "train.epochs=4",
        "train.eval_every=2",
        "quant.assign_cycle=2",
        f"partition.dir={tmp_path / 'parts'}",
        f"metrics.out={out}",
    )
    if mode == "adaqp-q":
        overrides += QUANTIZED
    if mode == "adaqp":  # both ranks share this host: float32 unless told to quantize
        overrides += ("quant.full_precision=never",)
    if mode == "adaqp-s":
        # Every exchange goes stale at the first choice (after epoch 1), whatever its wait:
        # over loopback a wait may or may not reach the default 2% of an epoch, and the
        # exchanges left fresh would go as float32 under the host model.
        overrides += ("staleness.min_hidden_fraction=0",)
    run_workers(_mode_worker, 2, tmp_path, overrides, timeout=240)
    summary = json.loads((out / "summary.json").read_text())
    missing = (SUMMARY_KEYS | ADDED_KEYS) - set(summary)
    assert not missing, f"{mode}: summary.json lost {sorted(missing)}"
    assert summary["cpu_time_s"] > 0
    assert summary["mode"] == mode and summary["epochs"] == 4
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    for line in lines:
        missing = (RECORD_KEYS | ADDED_KEYS) - set(line)
        assert not missing, f"{mode}: metrics.jsonl lost {sorted(missing)}"
        # CPU time of the step: positive, and no more than its threads could use.
        assert 0 < line["cpu_time_s"] <= line["epoch_time_s"] * (os.cpu_count() or 1) * 4
        assert line["halo_bytes"] == line["halo_bytes_per_epoch"]
    if mode == "adaqp-q":  # adaptive widths: the planner's report reached the summary
        assert summary["plan_bits_by_pair"], summary
        assert summary["avg_bits"] < 32 and summary["quant_scheme"] == "adaptive"
    if mode == "adaqp":  # the default scheme: every message at GCN's 1 bit, by pair
        assert summary["avg_bits"] == 1.0 and summary["quant_scheme"] == "uniform"
        assert summary["plan_bits_by_pair"] == {"0->1": 1.0, "1->0": 1.0}
        assert summary["host_of_rank"] == [0, 0]
    if mode == "adaqp":  # under the default cost model
        config = json.loads((out / "config.json").read_text())
        assert config["quant"]["cost_model"] == "host", config["quant"]
    if mode == "adaqp-s":  # choices after epochs 1 and 4; the first made every key stale
        assert summary["staleness_bound"] == 1 and summary["avg_bits"] == 1.0
        assert sorted(summary["drift_by_tag"]) == ["layer1/backward", "layer1/forward"]
        assert sorted(summary["stale_exchanges"]) == sorted(summary["drift_by_tag"])
    if mode == "onebit":
        assert summary["staleness_bound"] == 1 and summary["avg_bits"] == 1.0
    if mode in ("onebit", "adaqp-s"):  # 4 epochs: nothing read is older than 3 epochs
        assert 0 < summary["effective_staleness"] <= 3
        assert all(0 <= line["effective_staleness"] <= 3 for line in lines)
    else:
        assert summary["effective_staleness"] == 0
