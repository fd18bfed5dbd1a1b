"""The distributed full-graph training loop.

Every rank holds one part. Each epoch is one optimiser step on the whole graph: forward
with a halo exchange per layer, a loss summed over the local training nodes and divided
by the *global* number of training nodes, backward (halo gradients return to their
owners), one all-reduce of all parameter gradients, and an Adam step. Because the loss
is a global mean and gradients are summed, P workers compute what one process would on
the whole graph (Vanilla mode is exact).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from adaqp.comm import HaloExchanger
from adaqp.config import Config
from adaqp.layers import Propagation
from adaqp.local_graph import LocalGraph
from adaqp.metrics import EpochRecord, RunWriter, Summary, median_after_warmup
from adaqp.models import GNN
from adaqp.runtime import World

logger = logging.getLogger(__name__)


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

        torch.manual_seed(config.train.seed)
        self.model = GNN(config.model, dataset["feature_dim"], dataset["num_classes"])
        self.model.to(world.device)
        # Identical seeds already give identical weights; the broadcast makes it a fact.
        for tensor in self.model.state_dict().values():
            dist.broadcast(tensor, src=0)

        self.exchanger = None
        if world.world_size > 1:
            self.exchanger = HaloExchanger(
                world.rank,
                graph.send_idx,
                graph.send_counts,
                graph.recv_counts,
                timeout_s=config.comm.timeout_s,
            )
        self.propagation = Propagation(graph, self.model.norm, self.exchanger)
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
        return self.model(self.graph.features, self.propagation)

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
        loss_sum = self.local_loss_sum(self.logits())
        (loss_sum / self.num_train).backward()
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

    def _epoch_counters(self) -> tuple[float, float, float, int, dict[str, int]]:
        """Means over ranks of exchange and all-reduce times; sums of bytes."""
        stats = self.exchanger.stats if self.exchanger is not None else None
        tags = sorted(stats.bytes_by_tag) if stats else []
        values = [
            stats.exchange_s if stats else 0.0,
            stats.wait_s if stats else 0.0,
            self.allreduce_s,
            float(stats.bytes_sent if stats else 0),
        ]
        values += [float(stats.bytes_by_tag[t]) for t in tags]
        totals = self._all_sum(torch.tensor(values, dtype=torch.float64)).tolist()
        n = self.world.world_size
        by_tag = {t: int(v) for t, v in zip(tags, totals[4:], strict=True)}
        return totals[0] / n, totals[1] / n, totals[2] / n, int(totals[3]), by_tag

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
            comm_s, wait_s, allreduce_s, nbytes, by_tag = self._epoch_counters()
            record = EpochRecord(
                epoch, loss, epoch_time, comm_s, wait_s, allreduce_s, nbytes, bytes_by_tag=by_tag
            )
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
        return Summary(
            mode=cfg.comm.mode,
            dataset=cfg.data.dataset,
            model=cfg.model.name,
            world_size=self.world.world_size,
            epochs=cfg.train.epochs,
            final_train_loss=records[-1].train_loss,
            best_val_acc=best_val,
            best_epoch=best_epoch,
            test_acc=test_at_best,
            epoch_time_s=median_after_warmup(
                [r.epoch_time_s for r in records], cfg.train.warmup_epochs
            ),
            comm_time_s=median_after_warmup(
                [r.comm_time_s for r in records], cfg.train.warmup_epochs
            ),
            halo_bytes_per_epoch=records[-1].halo_bytes,
            avg_bits=32.0,
            max_staleness=0,
            comm_wait_s=median_after_warmup(
                [r.comm_wait_s for r in records], cfg.train.warmup_epochs
            ),
            allreduce_time_s=median_after_warmup(
                [r.allreduce_time_s for r in records], cfg.train.warmup_epochs
            ),
            total_time_s=time.perf_counter() - started,
            partition_dir="",
            edge_cut=int(self.meta.get("edge_cut", 0)),
            split_seed=cfg.data.split_seed,
            seed=cfg.train.seed,
            metric=self.meta["dataset"].get("info", {}).get("metric", "acc"),
        )


def _make_evaluator(info: dict[str, Any]):
    name = info.get("evaluator")
    if not name:
        return None
    from ogb.nodeproppred import Evaluator

    return Evaluator(name)


def progress_enabled(config: Config, world: World) -> bool:
    return world.is_main and config.metrics.progress and sys.stderr.isatty()
