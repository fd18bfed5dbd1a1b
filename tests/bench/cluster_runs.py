"""Made-up records of emulated-cluster runs, as ``adaqp.bench.cluster`` reads them from a
run's folder (``read_run``): a summary and its epochs, for the tests of its tables."""

from __future__ import annotations


def cluster_run(
    epoch_s: float,
    wait_s: float,
    val_curve: list[float],
    test_acc: float,
    nbytes: int,
    quant_s: float = 0.0,
) -> dict:
    """One run: every epoch takes ``epoch_s`` (``wait_s`` of it waiting on exchanges,
    ``quant_s`` quantizing), epoch i validates at ``val_curve[i]``, ``nbytes`` of halo per
    epoch split evenly between layer 1's forward and backward."""
    summary = {
        "epoch_time_s": epoch_s,
        "comm_wait_s": wait_s,
        "quant_time_s": quant_s,
        "dequant_time_s": 0.0,
        "allreduce_time_s": 0.01,
        "test_acc": test_acc,
        "halo_bytes_per_epoch": nbytes,
        "avg_bits": 32.0,
        "hidden_comm_fraction": 0.0,
        "halo_bytes_by_tag": {"layer1/forward": nbytes // 2, "layer1/backward": nbytes // 2},
    }
    epochs = [
        {"epoch": i + 1, "val_acc": v, "epoch_time_s": epoch_s, "train_time_s": (i + 1) * epoch_s}
        for i, v in enumerate(val_curve)
    ]
    return {"summary": summary, "epochs": epochs}
