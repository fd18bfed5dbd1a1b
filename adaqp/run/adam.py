"""Adam with L2 weight decay: ``torch.optim.Adam``'s update, value for value, without what
building that one costs a worker.

``torch.optim.Adam`` imports ``torch._dynamo`` (and with it sympy and mpmath, about 800
modules) the first time a parameter group is added and at every step, for graph breaks
that eager training never uses: about 70 MiB of Python objects in every worker, at one
host as at sixteen, and a second or two of start-up (results/bench/memory/phases/: "other
memory outside tensors", the same at P = 1 and P = 4). This class computes torch's
single-tensor update (what ``torch.optim.Adam`` runs on CPU tensors, with its defaults:
betas (0.9, 0.999), eps 1e-8, no amsgrad) in the same operations and the same order, so
its parameters equal torch's bit for bit (tests/run/test_adam.py), and keeps its state
under torch's names (``step``, ``exp_avg``, ``exp_avg_sq``), so a checkpoint reads the
same.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

BETAS = (0.9, 0.999)
EPS = 1e-8


class Adam:
    """``torch.optim.Adam(params, lr, weight_decay=...)`` for eager training (see the
    module docstring): ``param_groups`` (one group; its ``lr`` may be set between steps),
    ``zero_grad``, ``step``, ``state_dict`` and ``load_state_dict``."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0):
        self.params = list(params)
        if not self.params:
            raise ValueError("Adam got an empty parameter list")
        self.param_groups: list[dict[str, Any]] = [
            {"lr": lr, "betas": BETAS, "eps": EPS, "weight_decay": weight_decay}
        ]
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, weight_decay, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        for index, param in enumerate(self.params):
            if param.grad is None:
                continue
            state = self.state.get(index)
            if state is None:
                state = self.state[index] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }
            grad, exp_avg, exp_avg_sq = param.grad, state["exp_avg"], state["exp_avg_sq"]
            state["step"] += 1
            if weight_decay != 0:
                grad = grad.add(param, alpha=weight_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = state["step"].item()
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            step_size = lr / bias_correction1
            denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add_(eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: ``state`` by parameter index, and the group's settings."""
        group = dict(self.param_groups[0], params=list(range(len(self.params))))
        return {"state": {i: dict(s) for i, s in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes the per-parameter state (and the group's ``lr``) of ``state_dict``.

        Raises:
            ValueError: a state names a parameter this optimizer does not have, or misses
                one of ``step``, ``exp_avg``, ``exp_avg_sq``, or has another shape.
        """
        state: dict[int, dict[str, torch.Tensor]] = {}
        for index, entries in state_dict.get("state", {}).items():
            index = int(index)
            if not 0 <= index < len(self.params):
                raise ValueError(f"optimizer state for parameter {index}, of {len(self.params)}")
            missing = {"step", "exp_avg", "exp_avg_sq"} - set(entries)
            if missing:
                raise ValueError(f"optimizer state {index} lacks {', '.join(sorted(missing))}")
            param = self.params[index]
            for name in ("exp_avg", "exp_avg_sq"):
                if entries[name].shape != param.shape:
                    raise ValueError(
                        f"optimizer state {index}/{name} has shape {tuple(entries[name].shape)}, "
                        f"the parameter {tuple(param.shape)}"
                    )
            state[index] = {
                "step": torch.as_tensor(entries["step"], dtype=torch.float32).clone(),
                "exp_avg": entries["exp_avg"].to(param).clone(),
                "exp_avg_sq": entries["exp_avg_sq"].to(param).clone(),
            }
        self.state = state
        for group in state_dict.get("param_groups", [])[:1]:
            self.param_groups[0]["lr"] = group.get("lr", self.param_groups[0]["lr"])
