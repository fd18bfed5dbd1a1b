"""The distributed full-graph training loop.

Every rank holds one part. Each epoch is one optimiser step on the whole graph: forward
with a halo exchange per layer, a loss summed over the local training nodes and divided
by the *global* number of training nodes, backward (halo gradients return to their
owners), one all-reduce of all parameter gradients, and an Adam step. Because the loss
is a global mean and gradients are summed, P workers compute what one process would on
the whole graph (Vanilla mode is exact, and so is overlap-only ``adaqp-p``).

How each training-time exchange travels (float32, planned widths, or low-bit under
bounded staleness) is the exchange policy's choice (``adaqp/exchange/policy.py``); evaluation
always exchanges fresh rows in full precision.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from adaqp.config import OVERLAP_MODES, Config
from adaqp.exchange.by_mode import make_policy
from adaqp.exchange.counters import EpochCounters
from adaqp.exchange.nocomm import NoCommTransport
from adaqp.exchange.policy import ExchangePolicy
from adaqp.exchange.transport import (
    INPUT_CACHE_KEY,
    ExchangeKey,
    HaloTransport,
)
from adaqp.graph.local import LocalGraph
from adaqp.model.gnn import GNN
from adaqp.model.layers import Propagation
from adaqp.quant.kernels import compile_pending, use_compiled, warm_up
from adaqp.run.adam import Adam
from adaqp.run.checkpoint import Checkpointer
from adaqp.run.compute_rows import (
    global_rows,
    order_by_loss,
    select_rows,
    training_propagation,
)
from adaqp.run.failure import TrainingError, epoch_failure
from adaqp.run.gradsync import GradientBuckets, gnn_layer_groups
from adaqp.run.metrics import EpochRecord, RunWriter
from adaqp.run.schedule import set_learning_rate
from adaqp.run.summary import Outcome, RunFacts, Summary, last_solve, summarize
from adaqp.runtime import World, overlaps

logger = logging.getLogger(__name__)


class Trainer:
    """Owns the model, optimiser, transport, exchange policy and counters of one rank.

    Args:
        config: the resolved run configuration.
        graph: this rank's local graph (already on ``world.device``).
        meta: the partition's metadata (dataset sizes, evaluator name).
        world: rank, world size and device.
    """

    def __init__(
        self,
        config: Config,
        graph: LocalGraph,
        meta: dict[str, Any],
        world: World,
    ):
        self.config = config
        self.graph = graph
        self.meta = meta
        self.world = world
        dataset = meta["dataset"]
        self.multilabel = bool(dataset["multilabel"])
        mode = config.comm.mode
        distributed = world.world_size > 1
        self.cache_input = config.comm.cache_input_halo and distributed

        kernels = config.quant.kernels  # the quantizer and dropout path: passed down, not global
        if world.is_main and use_compiled(kernels, world.device) and compile_pending():
            # Else a minute of silence (launch/setup.sh compiles them ahead; numba's cache
            # serves later runs). Rank 0 says so and compiles now, the others on first use.
            logger.info("compiling the CPU kernels (first run only, up to a minute)")
            warm_up()
        torch.manual_seed(config.train.seed)
        self.model = GNN(
            config.model,
            dataset["feature_dim"],
            dataset["num_classes"],
            transform_first=config.comm.transform_first,
            cached_input=self.cache_input,
            kernels=kernels,
            seed=config.train.seed,
        )
        self.model.to(world.device)
        # Identical seeds already give identical weights; the broadcast makes it a fact.
        for tensor in self.model.state_dict().values():
            dist.broadcast(tensor, src=0)

        ring = None
        if config.train.compute_rows == "loss":
            # Inner rows in ring order (adaqp/graph/loss_rows.py), before anything holds it.
            ring = order_by_loss(graph, config.model.layers, world.rank, distributed)
        self.transport: HaloTransport | None = None
        if distributed:
            transport_type = NoCommTransport if mode == "nocomm" else HaloTransport
            self.transport = transport_type(
                world.rank,
                graph.send_counts,
                graph.recv_counts,
                timeout_s=config.comm.timeout_s,
                seed=config.quant.seed,
                device=world.device,
                kernels=kernels,
                send_idx=graph.send_idx,
                send_ids=graph.global_ids[graph.send_idx.cpu().numpy()],
                halo_ids=graph.halo_global_ids,
            )
        if mode == "nocomm":
            logger.warning(
                "mode nocomm skips the halo exchange: benchmark-only, the model "
                "trained is not the graph's (accuracy is not comparable)"
            )
        self.inputs = graph.features
        self.input_ids = graph.global_ids  # of each row of inputs: dropout's masks' keys
        self.input_cache_bytes = 0
        if self.cache_input:
            # Layer-0 inputs never change: fetch their halo rows once, in full precision.
            self.transport.at("set-up (layer-0 halo cache)")
            pending = self.transport.start(
                graph.features.index_select(0, graph.send_idx), INPUT_CACHE_KEY
            )
            self.inputs = torch.cat([graph.features, pending.wait()])
            # The inner rows' features are the cache's first rows: one copy, not two.
            graph.features = self.inputs[: graph.num_inner]
            self.input_ids = graph.local_global_ids
            sent = torch.tensor(float(pending.bytes_sent), dtype=torch.float64)
            self.input_cache_bytes = int(self._all_sum(sent))
        adjacency = graph.adjacency(self.model.norm)
        layer_rows = select_rows(graph, ring, self.transport, config.model.layers, self.cache_input)
        self.policy: ExchangePolicy | None = None
        if distributed:
            self.policy = make_policy(config, self.transport, graph, adjacency, world)
        options = {
            "overlap": mode in OVERLAP_MODES and overlaps(config.comm.overlap, world),
            "cached_input": self.cache_input,
            "linear": self.model.aggregates_linearly,
        }
        self.propagation = Propagation(graph, adjacency, self.policy, **options)  # every row
        totals = None if layer_rows is None else global_rows(layer_rows, world.device, distributed)
        self.train_propagation, self.rows_by_layer = training_propagation(
            graph, layer_rows, self.propagation, config.model.layers, totals
        )
        del adjacency  # held as the propagations' blocks
        self.optimizer = Adam(  # torch's update; not torch's class (adaqp/run/adam.py)
            self.model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay
        )
        self.buckets = GradientBuckets(
            gnn_layer_groups(self.model),
            enabled=config.comm.overlap_allreduce,
            timeout_s=config.comm.timeout_s,
        )
        self.num_train = int(self._all_sum(graph.train_mask.sum().double()).item())
        if self.num_train == 0:
            raise ValueError("the dataset has no training nodes")
        self.evaluator = _make_evaluator(dataset.get("info", {}))
        self.tags = [
            str(make(layer))
            for layer in range(config.model.layers)
            for make in (ExchangeKey.forward, ExchangeKey.backward)
        ]
        """Every exchange a training step may run, by metric name."""

    def _all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of ``tensor`` (a copy on the backend's device: NCCL refuses
        CPU tensors)."""
        tensor = tensor.to(self.world.device, copy=True)
        dist.all_reduce(tensor)
        return tensor

    def _at(self, step: str) -> None:
        if self.policy is not None:
            self.policy.at(step)

    def logits(self, epoch: int | None = None) -> torch.Tensor:
        """Forward pass: logits [I, C] for the inner nodes; a training one's (``epoch``,
        which keys dropout's masks) for the first rows only under ``compute_rows = "loss"``
        (the training rows among them)."""
        propagation = self.propagation if epoch is None else self.train_propagation
        return self.model(self.inputs, propagation, epoch, self.input_ids)

    def local_loss_sum(self, logits: torch.Tensor) -> torch.Tensor:
        """Sum of per-node losses over this rank's training nodes (``logits``: the first
        inner rows' at least, which hold them)."""
        rows = logits.shape[0]
        mask, labels = self.graph.train_mask[:rows], self.graph.labels[:rows]
        if self.multilabel:
            return (
                F.binary_cross_entropy_with_logits(
                    logits[mask], labels[mask].float(), reduction="sum"
                )
                / logits.shape[1]
            )
        return F.cross_entropy(logits[mask], labels[mask], reduction="sum")

    def train_step(self, counters: EpochCounters | None = None, epoch: int | None = None) -> float:
        """One full-graph optimiser step; returns the global mean training loss. ``epoch``
        keys its random draws (dropout, stochastic rounding) and numbers it in errors."""
        if self.transport is not None and epoch is not None:
            self.transport.begin_epoch(epoch)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        # Each layer's gradient all-reduce starts as soon as backward has finished it.
        self.buckets.start(epoch)
        if self.policy is None:
            loss_sum = self.local_loss_sum(self.logits(epoch))
            (loss_sum / self.num_train).backward()
        else:
            with self.policy.training():
                loss_sum = self.local_loss_sum(self.logits(epoch))
                (loss_sum / self.num_train).backward()
        times = self.buckets.finish()
        if counters is not None:
            counters.record_allreduce(times.blocked_s)
        set_learning_rate(self.optimizer, self.config.train, epoch)
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

    def _reduce(self, counters: EpochCounters) -> EpochCounters:
        """This epoch's counters combined over ranks (see ``EpochCounters.reduced``)."""

        def all_reduce(tensor: torch.Tensor, how: str) -> torch.Tensor:
            op = dist.ReduceOp.MAX if how == "max" else dist.ReduceOp.SUM
            tensor = tensor.to(self.world.device)
            dist.all_reduce(tensor, op=op)
            return tensor

        staleness_bound = self.policy.staleness_bound if self.policy is not None else 0
        return counters.reduced(all_reduce, self.world.world_size, self.tags, staleness_bound)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything this rank needs to continue the run exactly (for checkpoints); no
        generator: every random draw is keyed by the epoch (``adaqp/quant/draws.py``)."""
        state = {f"model/{k}": v for k, v in self.model.state_dict().items()}
        for index, entries in self.optimizer.state_dict()["state"].items():
            for name, value in entries.items():
                state[f"optimizer/{index}/{name}"] = torch.as_tensor(value)
        if self.policy is not None:
            state.update({f"policy/{k}": v for k, v in self.policy.state_dict().items()})
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        parts: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in state.items():
            kind, _, rest = name.partition("/")
            parts.setdefault(kind, {})[rest] = tensor
        self.model.load_state_dict(parts.get("model", {}))
        optimizer = self.optimizer.state_dict()
        optimizer["state"] = {}
        for name, tensor in parts.get("optimizer", {}).items():
            index, _, field = name.partition("/")
            optimizer["state"].setdefault(int(index), {})[field] = tensor
        self.optimizer.load_state_dict(optimizer)
        if self.policy is not None:
            self.policy.load_state_dict(parts.get("policy", {}))

    def fit(
        self,
        writer: RunWriter,
        on_epoch: Callable[[EpochRecord], None] | None = None,
        checkpoints: Checkpointer | None = None,
        resume: dict[str, Any] | None = None,
        facts: RunFacts | None = None,
    ) -> Summary:
        """Trains until epoch ``train.epochs``, writing one record per epoch.

        Args:
            writer: receives every epoch's record.
            on_epoch: called with every record (progress display).
            checkpoints: saves checkpoints when due.
            resume: the history of a checkpoint whose state was loaded
                (``load_state_dict``): training continues after its epoch.
            facts: what the launcher knows of the run, for the summary.
        """
        try:
            outcome = self._fit(writer, on_epoch, checkpoints, resume or {})
        finally:
            if self.policy is not None:
                self.policy.close()
        return summarize(self.config, self.world.world_size, outcome, facts or RunFacts())

    def step_epoch(self, epoch: int) -> EpochRecord:
        """Epoch ``epoch``'s training step as ``fit`` runs it, evaluation aside: the policy's
        epoch begun, the step timed between barriers, the counters reduced over the ranks,
        the policy's epoch ended (its re-solve's time in the record).

        Raises:
            TrainingError: the loss is not finite and ``train.stop_on_nonfinite`` is set.
        """
        counters = EpochCounters()
        if self.policy is not None:
            self.policy.begin_epoch(epoch, counters)
        self.world.synchronize()
        t0, cpu0 = time.perf_counter(), time.process_time()
        loss = self.train_step(counters, epoch)
        self.world.synchronize()
        epoch_time = time.perf_counter() - t0
        counters.cpu_time_s = time.process_time() - cpu0
        reduced = self._reduce(counters)
        record = EpochRecord.from_counters(epoch, loss, epoch_time, reduced)
        if not math.isfinite(loss) and self.config.train.stop_on_nonfinite:
            raise TrainingError(
                f"rank {self.world.rank}: training loss is {loss} at epoch {epoch}; "
                "check the learning rate and the input features (set "
                "train.stop_on_nonfinite=false to continue anyway)"
            )
        if self.policy is not None:
            record.solver_time_s = self.policy.end_epoch(
                epoch,
                record.exchange_after_arrival_by_tag,
                wait_s_by_tag=reduced.comm_wait_by_tag,
                epoch_s=epoch_time,
            )
        return record

    def _fit(
        self,
        writer: RunWriter,
        on_epoch: Callable[[EpochRecord], None] | None,
        checkpoints: Checkpointer | None,
        resume: dict[str, Any],
    ) -> Outcome:
        cfg = self.config
        records = [EpochRecord.from_json(r) for r in resume.get("records", [])]
        best_val = resume.get("best_val", -1.0)
        best_epoch = resume.get("best_epoch", 0)
        test_at_best = resume.get("test_at_best", 0.0)
        started = time.perf_counter() - resume.get("elapsed_s", 0.0)
        first = len(records) + 1
        for epoch in range(first, cfg.train.epochs + 1):
            try:
                record = self.step_epoch(epoch)
                record.wall_time_s = time.perf_counter() - started  # the re-solve included
                every = cfg.train.eval_every
                if (every and epoch % every == 0) or epoch == cfg.train.epochs:
                    self._at(f"epoch {epoch} evaluation")
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
                if checkpoints is not None and checkpoints.due(epoch, cfg.train.epochs):
                    self._at(f"epoch {epoch} checkpoint")
                    history = {
                        "records": [r.to_json() for r in records],
                        "best_val": best_val,
                        "best_epoch": best_epoch,
                        "test_at_best": test_at_best,
                        "elapsed_s": time.perf_counter() - started,
                    }
                    checkpoints.save(epoch, self.state_dict(), history)
                if on_epoch is not None:
                    on_epoch(record)
            except TrainingError:
                raise
            except (RuntimeError, ValueError) as exc:
                # This rank's own: gloo/nccl failures, timeouts, checkpoint I/O, and bad
                # values (a NaN the quantizer met) that its peers never saw.
                raise epoch_failure(self.world, epoch, exc) from exc
        total_s = time.perf_counter() - started
        peak = torch.tensor(
            float(self.world.peak_memory_bytes()), dtype=torch.float64, device=self.world.device
        )
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        return Outcome(
            records=records,
            best_val_acc=best_val,
            best_epoch=best_epoch,
            test_acc_at_best_val=test_at_best,
            total_time_s=total_s,
            peak_memory_mb=float(peak) / 2**20,
            input_cache_bytes=self.input_cache_bytes,
            cache_input_halo=self.cache_input,
            overlap=self.propagation.overlap,
            edge_cut=int(self.meta.get("edge_cut", 0)),
            metric=self.meta["dataset"].get("info", {}).get("metric", "acc"),
            plan_report=self.policy.report(last_solve(records)) if self.policy else {},
            rows_by_layer=[int(n) for n in self._all_sum(torch.tensor(self.rows_by_layer))],
        )


def _make_evaluator(info: dict[str, Any]):
    name = info.get("evaluator")
    if not name:
        return None
    from ogb.nodeproppred import Evaluator

    return Evaluator(name)
