"""The distributed full-graph training loop.

Every rank holds one part. Each epoch is one optimiser step on the whole graph: forward
with a halo exchange per layer, a loss summed over the local training nodes and divided
by the *global* number of training nodes, backward (halo gradients return to their
owners), one all-reduce of all parameter gradients, and an Adam step. Because the loss
is a global mean and gradients are summed, P workers compute what one process would on
the whole graph (Vanilla mode is exact, and so is overlap-only ``adaqp-p``).

Quantized modes send training-time halo messages at planned bit widths (see
``adaqp/planner.py``); evaluation always exchanges full precision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from adaqp.comm import FULL_PRECISION_BITS, HaloExchanger, NoCommExchanger
from adaqp.config import OVERLAP_MODES, QUANTIZED_MODES, Config
from adaqp.layers import Propagation
from adaqp.local_graph import LocalGraph
from adaqp.metrics import EpochRecord, RunWriter, Summary, median_after_warmup
from adaqp.models import GNN
from adaqp.planner import BitWidthPlanner
from adaqp.runtime import World

logger = logging.getLogger(__name__)

BIT_WIDTHS = (1, 2, 4, 8, FULL_PRECISION_BITS)


class TrainingError(RuntimeError):
    """A training step failed (often a dead or stuck peer); names the rank and epoch."""


class Trainer:
    """Owns the model, optimiser, exchanger and counters of one rank.

    Args:
        config: the resolved run configuration.
        graph: this rank's local graph (already on ``world.device``).
        meta: the partition's metadata (dataset sizes, evaluator name).
        world: rank, world size and device.
    """

    def __init__(self, config: Config, graph: LocalGraph, meta: dict[str, Any], world: World):
        self.config = config
        self.graph = graph
        self.meta = meta
        self.world = world
        dataset = meta["dataset"]
        self.multilabel = bool(dataset["multilabel"])
        mode = config.comm.mode
        distributed = world.world_size > 1
        cache_input = config.comm.cache_input_halo and distributed
        self.cache_input = cache_input

        torch.manual_seed(config.train.seed)
        self.model = GNN(
            config.model,
            dataset["feature_dim"],
            dataset["num_classes"],
            transform_first=config.comm.transform_first,
            cached_input=cache_input,
        )
        self.model.to(world.device)
        # Identical seeds already give identical weights; the broadcast makes it a fact.
        for tensor in self.model.state_dict().values():
            dist.broadcast(tensor, src=0)

        self.exchanger = None
        if distributed:
            exchanger_type = NoCommExchanger if mode == "nocomm" else HaloExchanger
            self.exchanger = exchanger_type(
                world.rank,
                graph.send_idx,
                graph.send_counts,
                graph.recv_counts,
                timeout_s=config.comm.timeout_s,
                seed=config.quant.seed,
            )
        self.propagation = Propagation(
            graph, self.model.norm, self.exchanger, overlap=mode in OVERLAP_MODES
        )
        self.inputs = graph.features
        self.input_cache_bytes = 0
        if mode == "nocomm":
            logger.warning(
                "mode nocomm skips the halo exchange: benchmark-only, the model "
                "trained is not the graph's (accuracy is not comparable)"
            )
        if cache_input:
            # Layer-0 inputs never change: fetch their halo rows once, in full precision.
            self.exchanger.step = "set-up (layer-0 halo cache)"
            halo = self.exchanger.start(graph.features, tag="layer0/input-cache").wait()
            self.inputs = torch.cat([graph.features, halo])
            self.input_cache_bytes = int(
                self._all_sum(
                    torch.tensor(float(self.exchanger.stats.bytes_sent), dtype=torch.float64)
                )
            )
            self.exchanger.stats.reset()
        self.planner = None
        if distributed and mode in QUANTIZED_MODES:
            self.planner = BitWidthPlanner(config.quant, self.exchanger, self.propagation, world)
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay
        )
        self.num_train = int(self._all_sum(graph.train_mask.sum().double()).item())
        if self.num_train == 0:
            raise ValueError("the dataset has no training nodes")
        self.allreduce_s = 0.0
        self.evaluator = _make_evaluator(dataset.get("info", {}))

    def _all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        dist.all_reduce(tensor)
        return tensor

    def _set_step(self, step: str) -> None:
        if self.exchanger is not None:
            self.exchanger.step = step

    def logits(self) -> torch.Tensor:
        """Forward pass over the inner nodes: logits [I, C]."""
        return self.model(self.inputs, self.propagation)

    def local_loss_sum(self, logits: torch.Tensor) -> torch.Tensor:
        """Sum of per-node losses over this rank's training nodes."""
        mask = self.graph.train_mask
        if self.multilabel:
            return (
                F.binary_cross_entropy_with_logits(
                    logits[mask], self.graph.labels[mask].float(), reduction="sum"
                )
                / logits.shape[1]
            )
        return F.cross_entropy(logits[mask], self.graph.labels[mask], reduction="sum")

    def sync_gradients(self) -> None:
        """Sums parameter gradients over ranks with one flat all-reduce."""
        start = time.perf_counter()
        params = [p for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n
        self.allreduce_s += time.perf_counter() - start

    def train_step(self) -> float:
        """One full-graph optimiser step; returns the global mean training loss."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.planner is not None:
            self.planner.training(True)
        try:
            loss_sum = self.local_loss_sum(self.logits())
            (loss_sum / self.num_train).backward()
        finally:
            if self.planner is not None:
                self.planner.training(False)
        self.sync_gradients()
        self.optimizer.step()
        return float(self._all_sum(loss_sum.detach()).item()) / self.num_train

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Full-precision accuracy on the train, val and test nodes of the whole graph."""
        self.model.eval()
        logits = self.logits()
        counts = []
        for mask in (self.graph.train_mask, self.graph.val_mask, self.graph.test_mask):
            counts += [self._correct(logits[mask], self.graph.labels[mask]), float(mask.sum())]
        totals = self._all_sum(torch.tensor(counts, dtype=torch.float64, device=logits.device))
        totals = totals.tolist()
        return {
            name: totals[2 * i] / totals[2 * i + 1] if totals[2 * i + 1] else 0.0
            for i, name in enumerate(("train_acc", "val_acc", "test_acc"))
        }

    def _correct(self, logits: torch.Tensor, labels: torch.Tensor) -> float:
        """Number of correct predictions (a sum, so ranks' counts add up)."""
        if len(labels) == 0:
            return 0.0
        if self.multilabel:
            return float(((logits > 0).float() == labels.float()).float().mean(1).sum())
        pred = logits.argmax(1)
        if self.evaluator is not None:
            # The official metric; accuracy times count is additive over ranks.
            result = self.evaluator.eval(
                {"y_true": labels.view(-1, 1).cpu(), "y_pred": pred.view(-1, 1).cpu()}
            )
            return float(result["acc"]) * len(labels)
        return float((pred == labels).sum())

    def _epoch_counters(self) -> dict[str, Any]:
        """This epoch's exchange counters: times are means over ranks, bytes are sums."""
        stats = self.exchanger.stats if self.exchanger is not None else None
        tags = sorted(stats.bytes_by_tag) if stats else []
        names = ["exchange_s", "wait_s", "quant_s", "dequant_s"]
        values = [getattr(stats, n) if stats else 0.0 for n in names] + [self.allreduce_s]
        values.append(float(stats.bytes_sent if stats else 0))
        values += [float(stats.values_by_bits.get(b, 0) if stats else 0) for b in BIT_WIDTHS]
        values += [float(stats.bytes_by_tag[t]) for t in tags]
        totals = self._all_sum(torch.tensor(values, dtype=torch.float64)).tolist()
        n = self.world.world_size
        out: dict[str, Any] = {name: totals[i] / n for i, name in enumerate(names)}
        out["allreduce_s"] = totals[4] / n
        out["bytes"] = int(totals[5])
        by_bits = {str(b): int(v) for b, v in zip(BIT_WIDTHS, totals[6:11], strict=True) if v}
        out["values_by_bits"] = by_bits
        sent = sum(by_bits.values())
        out["avg_bits"] = (
            sum(int(b) * v for b, v in by_bits.items()) / sent
            if sent
            else float(FULL_PRECISION_BITS)
        )
        out["bytes_by_tag"] = {t: int(v) for t, v in zip(tags, totals[11:], strict=True)}
        return out

    def fit(
        self, writer: RunWriter, on_epoch: Callable[[EpochRecord], None] | None = None
    ) -> Summary:
        """Trains for ``train.epochs`` epochs, writing one record per epoch."""
        cfg = self.config
        records: list[EpochRecord] = []
        best_val, best_epoch, test_at_best = -1.0, 0, 0.0
        started = time.perf_counter()
        for epoch in range(1, cfg.train.epochs + 1):
            self._set_step(f"epoch {epoch}")
            if self.exchanger is not None:
                self.exchanger.stats.reset()
            self.allreduce_s = 0.0
            self.world.synchronize()
            t0 = time.perf_counter()
            try:
                loss = self.train_step()
            except RuntimeError as exc:
                raise TrainingError(
                    f"rank {self.world.rank}: training step failed at epoch {epoch}: {exc}"
                ) from exc
            self.world.synchronize()
            epoch_time = time.perf_counter() - t0
            c = self._epoch_counters()
            record = EpochRecord(
                epoch,
                loss,
                epoch_time,
                c["exchange_s"],
                c["wait_s"],
                c["allreduce_s"],
                c["bytes"],
                bytes_by_tag=c["bytes_by_tag"],
                quant_time_s=c["quant_s"],
                dequant_time_s=c["dequant_s"],
                avg_bits=c["avg_bits"],
                values_by_bits=c["values_by_bits"],
                wall_time_s=time.perf_counter() - started,
            )
            if self.planner is not None:
                self._set_step(f"epoch {epoch} bit-width assignment")
                record.assign_time_s = self.planner.end_epoch(epoch)
            every = cfg.train.eval_every
            if (every and epoch % every == 0) or epoch == cfg.train.epochs:
                self._set_step(f"epoch {epoch} evaluation")
                acc = self.evaluate()
                record.train_acc, record.val_acc, record.test_acc = (
                    acc["train_acc"],
                    acc["val_acc"],
                    acc["test_acc"],
                )
                if acc["val_acc"] > best_val:
                    best_val, best_epoch, test_at_best = acc["val_acc"], epoch, acc["test_acc"]
            records.append(record)
            writer.log_epoch(record)
            if on_epoch is not None:
                on_epoch(record)
        return self._summary(
            records, best_val, best_epoch, test_at_best, time.perf_counter() - started
        )

    def _summary(
        self,
        records: list[EpochRecord],
        best_val: float,
        best_epoch: int,
        test_at_best: float,
        total_s: float,
    ) -> Summary:
        cfg = self.config
        warmup = cfg.train.warmup_epochs

        def median(name: str) -> float:
            return median_after_warmup([getattr(r, name) for r in records], warmup)

        last = records[-1]
        exchange, wait = median("comm_time_s"), median("comm_wait_s")
        peak = torch.tensor(float(self.world.peak_memory_bytes()), dtype=torch.float64)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        return Summary(
            mode=cfg.comm.mode,
            dataset=cfg.data.dataset,
            model=cfg.model.name,
            world_size=self.world.world_size,
            epochs=cfg.train.epochs,
            final_train_loss=last.train_loss,
            best_val_acc=best_val,
            best_epoch=best_epoch,
            test_acc=test_at_best,
            epoch_time_s=median("epoch_time_s"),
            comm_time_s=exchange,
            halo_bytes_per_epoch=last.halo_bytes,
            avg_bits=last.avg_bits,
            max_staleness=0,
            comm_wait_s=wait,
            allreduce_time_s=median("allreduce_time_s"),
            total_time_s=total_s,
            partition_dir="",
            edge_cut=int(self.meta.get("edge_cut", 0)),
            split_seed=cfg.data.split_seed,
            seed=cfg.train.seed,
            metric=self.meta["dataset"].get("info", {}).get("metric", "acc"),
            quant_time_s=median("quant_time_s"),
            dequant_time_s=median("dequant_time_s"),
            hidden_comm_fraction=(exchange - wait) / exchange if exchange > 0 else 0.0,
            halo_bytes_by_tag=last.bytes_by_tag,
            bits_histogram=last.values_by_bits,
            solver_time_s=sum(r.assign_time_s for r in records),
            input_cache_bytes=self.input_cache_bytes,
            cache_input_halo=self.cache_input,
            transform_first=cfg.comm.transform_first,
            quant_scheme=cfg.quant.scheme if cfg.comm.mode in QUANTIZED_MODES else "",
            peak_memory_mb=float(peak) / 2**20,
        )


def _make_evaluator(info: dict[str, Any]):
    name = info.get("evaluator")
    if not name:
        return None
    from ogb.nodeproppred import Evaluator

    return Evaluator(name)
