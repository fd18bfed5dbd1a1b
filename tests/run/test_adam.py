"""``adaqp.run.adam.Adam``: torch's Adam update bit for bit, without importing torch._dynamo."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from adaqp.run.adam import Adam


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))


def _steps(model, optimizer, steps, first=0, rates=(0.05, 0.01, 0.2)):
    for step in range(first, first + steps):
        gen = torch.Generator().manual_seed(100 + step)
        x = torch.randn(11, 7, generator=gen)
        optimizer.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        if step % 3 == 2:  # a parameter without a gradient is skipped, as torch skips it
            model[1].bias.grad = None
        optimizer.param_groups[0]["lr"] = rates[step % len(rates)]
        optimizer.step()


@pytest.mark.parametrize("weight_decay", [0.0, 5e-4])
def test_every_parameter_equals_torchs_bit_for_bit(weight_decay):
    ours, theirs = _model(0), _model(0)
    a = Adam(ours.parameters(), lr=0.05, weight_decay=weight_decay)
    b = torch.optim.Adam(theirs.parameters(), lr=0.05, weight_decay=weight_decay)
    _steps(ours, a, 12)
    _steps(theirs, b, 12)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)
    for i, state in b.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(a.state_dict()["state"][i][name], value), (i, name)


def test_a_state_saved_and_loaded_continues_the_same_and_reads_torchs():
    whole, resumed, from_torch = _model(1), _model(1), _model(1)
    a = Adam(whole.parameters(), lr=0.05, weight_decay=5e-4)
    _steps(whole, a, 5)
    saved = {k: v.detach().clone() for k, v in whole.state_dict().items()}
    state = copy.deepcopy(a.state_dict())  # the state's tensors change in place
    _steps(whole, a, 4, first=5)

    resumed.load_state_dict(saved)
    b = Adam(resumed.parameters(), lr=0.05, weight_decay=5e-4)
    b.load_state_dict(state)
    _steps(resumed, b, 4, first=5)

    torch_model = _model(1)
    t = torch.optim.Adam(torch_model.parameters(), lr=0.05, weight_decay=5e-4)
    _steps(torch_model, t, 5)
    from_torch.load_state_dict(torch_model.state_dict())
    c = Adam(from_torch.parameters(), lr=0.05, weight_decay=5e-4)
    c.load_state_dict(t.state_dict())  # a checkpoint written with torch's Adam
    _steps(from_torch, c, 4, first=5)
    models = (whole, resumed, from_torch)
    for p, q, r in zip(*(m.parameters() for m in models), strict=True):
        assert torch.equal(p, q) and torch.equal(p, r)


def test_a_state_that_does_not_fit_is_refused():
    model = _model(2)
    optimizer = Adam(model.parameters(), lr=0.05)
    _steps(model, optimizer, 1)
    state = optimizer.state_dict()
    other = Adam(_model(2)[:1].parameters(), lr=0.05)
    with pytest.raises(ValueError, match="optimizer state for parameter 2, of 2"):
        other.load_state_dict(state)
    del state["state"][0]["exp_avg_sq"]
    with pytest.raises(ValueError, match="optimizer state 0 lacks exp_avg_sq"):
        Adam(model.parameters(), lr=0.05).load_state_dict(state)
    with pytest.raises(ValueError, match="empty parameter list"):
        Adam([], lr=0.05)


def test_training_never_imports_torch_dynamo(tmp_path):
    # torch.optim.Adam would (about 70 MiB of modules in every worker).
    probe = textwrap.dedent(
        f"""
        import sys
        from adaqp.train import main
        code = main(["--config", "configs/cora-gcn.toml", "--epochs", "2",
                     "--out", {str(tmp_path / "run")!r}])
        assert code == 0, code
        print("torch._dynamo" in sys.modules, "sympy" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout.split()
    assert out[-2:] == ["False", "False"]
