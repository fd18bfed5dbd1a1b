"""Vanilla's learning curves on the signal workload, one process: the runs behind this
reading's recipes.

``python results/bench/recipes/signal/sweep.py GROUP [GROUP ...] [--jobs 2]`` runs each
group's specs (``GROUPS`` below) that ``runs.json`` does not hold yet, each as
``python -m adaqp.train --mode vanilla`` with one torch thread and validation every epoch,
``--jobs`` at a time, and keeps every epoch's loss and accuracies in ``runs.json``.
``--report`` prints each spec's plateau (:func:`plateau`) and writes ``plateaus.json``.

A spec with ``init`` trains with other initial weights than the library's: the run goes
through :func:`train_with_init`, which replaces the conv classes' ``__init__`` before
training (how the candidate inits were measured before one went into the library).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
CONFIG = "configs/cluster-synthetic-signal-gcn.toml"
RUNS = HERE / "runs.json"
WINDOW = 40
"""Epochs after which the best validation accuracy so far must still have risen."""
RISE = 0.003
"""What it must have risen by (0.3 points) for the curve not to have plateaued."""
TOLERANCE = 0.005
"""How close to a long run's best validation accuracy counts as there (0.5 points: the
cluster benchmark's default ``--tta-tolerance``)."""

GAT = ("model.hidden=32", "model.heads=4", "model.attn_dropout=0.0")
"""MODEL_SETTINGS' GAT architecture (adaqp/bench/__init__.py), without its lr."""


OLD = {"gcn": (0.01, 0, 80), "sage": (0.01, 0, 60), "gat": (0.005, 0, 60)}
"""The benchmark's recipes before this reading: lr, warm-up and epochs per model."""


RECIPES = [
    ("gcn", 0.01, 10, 300),
    ("gcn", 0.02, 10, 300),
    ("gcn", 0.02, 10, 500),
    ("gcn", 0.05, 10, 300),
    ("gcn", 0.05, 10, 400),
    ("sage", 0.01, 10, 300),
    ("gat", 0.01, 10, 300),
    ("gat", 0.01, 10, 500),
]
"""The recipes run long (model, lr, warm-up epochs, run epochs), over the seeds run."""

GAT_LR = 0.01
"""GAT's learning rate in the recipe (the screen's better of 0.01 and 0.02 with a warm-up)."""


def spec(model: str, lr: float, epochs: int, seed: int = 0, **extra) -> dict:
    return {"model": model, "lr": lr, "epochs": epochs, "seed": seed, **extra}


def key(s: dict) -> str:
    return ",".join(f"{k}={s[k]}" for k in sorted(s))


def _seeds(model, lr, epochs, **extra):
    return [spec(model, lr, epochs, seed, **extra) for seed in (0, 1, 2)]


GROUPS: dict[str, list[dict]] = {
    # Why SAGE starts slowly: one change at a time, 40 epochs, seed 0.
    "diagnose": [
        spec("sage", 0.01, 40),
        spec("sage", 0.01, 40, sets=("model.dropout=0.0",)),
        spec("sage", 0.01, 40, sets=("model.layernorm=false",)),
        spec("sage", 0.003, 40),
        spec("sage", 0.001, 40),
        spec("sage", 0.01, 40, init="glorot"),
        spec("gcn", 0.01, 40),
        spec("gcn", 0.01, 40, init="glorot"),
    ],
    # Learning rate and warm-up, seed 0, 200 epochs (lr 0.003 on SAGE first: no warm-up
    # and 10 epochs of it).
    "screen": [
        spec("sage", 0.003, 200, warmup=0),
        spec("sage", 0.003, 200, warmup=10),
        spec("sage", 0.01, 200, warmup=0),
        spec("sage", 0.01, 200, warmup=10),
        spec("gat", 0.005, 200, warmup=0),
        spec("gcn", 0.01, 200, warmup=0),
        spec("sage", 0.02, 200, warmup=10),
        spec("gcn", 0.01, 200, warmup=10),
        spec("gat", 0.01, 200, warmup=10),
        spec("gcn", 0.02, 200, warmup=10),
        spec("gat", 0.02, 200, warmup=10),
        spec("gcn", 0.003, 200, warmup=0),
        spec("gat", 0.005, 200, warmup=10),
    ],
    # The chosen recipes, 3 seeds, 300 epochs; then the old recipes' other seeds.
    "confirm-gcn-sage": [
        spec(m, 0.01, 300, seed, warmup=10) for seed in (0, 1, 2) for m in ("sage", "gcn")
    ],
    "confirm-gat": [spec("gat", GAT_LR, 300, seed, warmup=10) for seed in (0, 1, 2)],
    "old": [
        spec(m, lr, epochs, seed, warmup=0) for m, (lr, _, epochs) in OLD.items() for seed in (1, 2)
    ],
    # GCN had not plateaued by 300 epochs at lr 0.01: the screen's lr 0.02 over 3 seeds.
    "gcn-lr-a": [spec("gcn", 0.02, 300, seed, warmup=10) for seed in (0, 1)],
    "gcn-lr-b": [spec("gcn", 0.02, 300, 2, warmup=10)],
    # Do GCN and GAT plateau at all? Seed 0 to 500 epochs.
    "long-gat": [spec("gat", 0.01, 500, 0, warmup=10)],
    "long-gcn": [spec("gcn", 0.02, 500, 0, warmup=10)],
    "long-gat-seeds": [spec("gat", 0.01, 500, seed, warmup=10) for seed in (1, 2)],
    "long-gcn-1": [spec("gcn", 0.02, 500, 1, warmup=10)],
    "long-gcn-2": [spec("gcn", 0.02, 500, 2, warmup=10)],
    # GCN rose faster at 0.02 than at 0.01: higher still.
    "gcn-lr-hi": [spec("gcn", 0.05, 300, 0, warmup=10)],
    "gcn-lr-hi-seeds": [spec("gcn", 0.05, 400, seed, warmup=10) for seed in (1, 2, 0)],
}


def _command(s: dict, out: str) -> list[str]:
    args = ["--config", CONFIG, "--mode", "vanilla", "--seed", str(s["seed"])]
    args += ["--epochs", str(s["epochs"]), "--out", out, "--overwrite"]
    sets = [f"model.name={s['model']}", f"train.lr={s['lr']}", "train.eval_every=1"]
    sets += ["checkpoint.every=0", "metrics.progress=false"]
    sets += list(GAT if s["model"] == "gat" else ()) + list(s.get("sets", ()))
    if s.get("warmup"):
        sets.append(f"train.lr_warmup_epochs={s['warmup']}")
    for item in sets:
        args += ["--set", item]
    if "init" in s:
        code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import sweep; "
        code += f"sweep.train_with_init({s['init']!r}, sys.argv[1:])"
        return [sys.executable, "-c", code, *args]
    return [sys.executable, "-m", "adaqp.train", *args]


def train_with_init(init: str, argv: list[str]) -> None:
    """``python -m adaqp.train argv`` with the conv layers' weights initialised by ``init``:
    ``glorot`` (every weight Xavier-uniform, biases zero: PyG's GCNConv and GATConv)."""
    import torch
    from torch import nn

    from adaqp import train
    from adaqp.model import layers

    def glorot(module: nn.Module) -> None:
        for name, p in module.named_parameters(recurse=False):
            if name == "bias":
                nn.init.zeros_(p)
        for sub in module.children():
            if isinstance(sub, nn.Linear):
                nn.init.xavier_uniform_(sub.weight)
                if sub.bias is not None:
                    nn.init.zeros_(sub.bias)

    inits = {"glorot": glorot}
    for cls in (layers.GCNConv, layers.SAGEConv, layers.GATConv):
        original = cls.__init__

        def patched(self, *a, _original=original, **kw):
            _original(self, *a, **kw)
            with torch.no_grad():
                inits[init](self)

        cls.__init__ = patched
    code = train.main(argv)
    train.exit_now(code)


def _run(s: dict, tree: Path = ROOT) -> tuple[str, dict | str]:
    with tempfile.TemporaryDirectory(prefix="recipe-") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        done = subprocess.run(_command(s, tmp), cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return key(s), f"exit {done.returncode}: {done.stderr[-2000:]}"
        epochs = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").open()]
    curve = {
        name: [round(e[name], 5) for e in epochs]
        for name in ("train_loss", "train_acc", "val_acc", "test_acc")
    }
    curve["epoch_time_s"] = statistics.median(e["epoch_time_s"] for e in epochs)
    return key(s), {"spec": s, **curve}


def _record(k: str, result: dict | str) -> dict:
    """Adds one run to ``runs.json`` under a lock (two sweeps may share the file)."""
    with open(Path(tempfile.gettempdir()) / "adaqp-recipes-signal.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = json.loads(RUNS.read_text()) if RUNS.exists() else {}
        runs[k] = result
        lines = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in runs.items())
        RUNS.write_text("{\n" + lines + "\n}\n")  # one run a line
    return runs


def plateau(val: list[float], window: int = WINDOW, rise: float = RISE) -> dict | None:
    """The first epoch E after which the best validation accuracy so far rises by less than
    ``rise`` over the next ``window`` epochs; None where the curve ends first."""
    best, so_far = [], 0.0
    for v in val:
        so_far = max(so_far, v)
        best.append(so_far)
    for e in range(len(best) - window):
        if best[e + window] - best[e] < rise:
            return {"epoch": e + 1, "val_acc": best[e], "best_val_acc": best[-1]}
    return None


def reach(val: list[float], tolerance: float = TOLERANCE) -> dict:
    """The first epoch whose validation accuracy is within ``tolerance`` of the run's best."""
    best = max(val)
    epoch = next(e for e, v in enumerate(val, 1) if v >= best - tolerance)
    return {"epoch": epoch, "val_acc": val[epoch - 1], "best_val_acc": best}


def report(runs: dict) -> dict:
    out = {}
    for k, r in sorted(runs.items()):
        if isinstance(r, str):
            print(f"{k}: FAILED {r[:200]}")
            continue
        p = plateau(r["val_acc"])
        v = r["val_acc"]
        at = {e: v[e - 1] for e in (20, 40, 60, 80, 100, 150, 200, 300) if e <= len(v)}
        out[k] = {"spec": r["spec"], "plateau": p, "val_at": at, "best": max(v)}
        text = f"plateau e{p['epoch']} {p['val_acc']:.4f}" if p else "no plateau"
        loss = r["train_loss"]
        print(
            f"{k}: {text}; best {max(v):.4f}; loss e10 {loss[min(9, len(loss) - 1)]:.3f} "
            f"e20 {loss[min(19, len(loss) - 1)]:.3f}; val "
            + " ".join(f"{e}:{a:.3f}" for e, a in at.items())
        )
    return out


def _mean_std(values: list[float]) -> list[float] | None:
    return [statistics.mean(values), statistics.stdev(values)] if len(values) > 1 else None


def _best_so_far(val: list[float]) -> list[float]:
    best, out = 0.0, []
    for v in val:
        best = max(best, v)
        out.append(best)
    return out


def table(runs: dict, recipes: list[tuple[str, float, int, int]]) -> dict:
    """Per model and recipe: the old recipe's validation accuracy at its epoch count; the
    new one's per seed over ``long_epochs``: its best, the first epoch within
    ``TOLERANCE`` of it, the trailing-window plateau (:func:`plateau`) and how much the
    best so far still rose over the last ``WINDOW`` epochs; the benchmark's epochs (every
    seed within ``TOLERANCE`` of its best, up to a multiple of 10)."""
    out = {}
    for model, lr, warmup, long_epochs in recipes:
        old_lr, old_warmup, old_epochs = OLD[model]
        old = []
        for seed in (0, 1, 2):
            for epochs in (old_epochs, 200):  # seed 0's old recipe ran 200 epochs
                r = runs.get(key(spec(model, old_lr, epochs, seed, warmup=old_warmup)))
                if isinstance(r, dict):
                    val = r["val_acc"][:old_epochs]
                    old.append({"seed": seed, "final_val_acc": val[-1], "best_val_acc": max(val)})
                    break
        seeds = []
        for seed in (0, 1, 2):
            r = runs.get(key(spec(model, lr, long_epochs, seed, warmup=warmup)))
            if not isinstance(r, dict):
                continue
            val, best = r["val_acc"], _best_so_far(r["val_acc"])
            p = plateau(val)
            seeds.append(
                {
                    "seed": seed,
                    "best_val_acc": best[-1],
                    "reach_epoch": reach(val)["epoch"],
                    "plateau_epoch": p and p["epoch"],
                    "plateau_val_acc": p and p["val_acc"],
                    "rise_over_last_window": best[-1] - best[-1 - WINDOW],
                    "val_acc_at": {
                        e: val[e - 1] for e in (20, 40, 60, 80, 100, 150, 200, 250, 300)
                    },
                }
            )
        epochs = max((x["reach_epoch"] for x in seeds), default=0)
        epochs = -(-epochs // 10) * 10
        for x in seeds:
            run = runs[key(spec(model, lr, long_epochs, x["seed"], warmup=warmup))]
            x["final_val_acc_at_recipe_epochs"] = run["val_acc"][epochs - 1]
            x["best_val_acc_by_recipe_epochs"] = max(run["val_acc"][:epochs])
        entry = {
            "old": {"lr": old_lr, "warmup": old_warmup, "epochs": old_epochs, "seeds": old},
            "new": {
                "lr": lr,
                "warmup": warmup,
                "run_epochs": long_epochs,
                "epochs": epochs,
                "seeds": seeds,
            },
        }
        for side in entry.values():
            for field in side["seeds"][0] if side["seeds"] else ():
                values = [x[field] for x in side["seeds"] if isinstance(x[field], float | int)]
                if field != "seed" and len(values) == len(side["seeds"]):
                    side[field] = _mean_std(values)
        if seeds:
            out[f"{model} lr {lr} warm-up {warmup}, {long_epochs} epochs"] = entry
    return out


def _pm(pair: list[float] | float | None, scale: float = 100.0, digits: int = 1) -> str:
    """``mean ± std`` of a pair, a lone value as it is, "-" for none."""
    if pair is None:
        return "-"
    if isinstance(pair, float | int):
        return f"{scale * pair:.{digits}f}"
    return f"{scale * pair[0]:.{digits}f} ± {scale * pair[1]:.{digits}f}"


def markdown(recipes: dict) -> str:
    """The reading's table: each model's old recipe, then the new one (means ± std over
    seeds; accuracies in %)."""
    rows = [
        "| model | lr | warm-up | seeds | run | epochs | val acc at the last epoch "
        "| best val acc by then | best val acc in the run | epoch within 0.5 of it "
        "| rise over the run's last 40 epochs | first trailing-window plateau: epoch, val acc |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    last = None
    for name, entry in recipes.items():
        old, new = entry["old"], entry["new"]
        model = name.split()[0]
        if model != last:
            rows.append(
                f"| {model} (old) | {old['lr']} | {old['warmup']} | {len(old['seeds'])} | "
                f"| {old['epochs']} | {_pm(old.get('final_val_acc'))} "
                f"| {_pm(old.get('best_val_acc'))} | | | | |"
            )
            last = model
        epochs = max(x["reach_epoch"] for x in new["seeds"]) if new["seeds"] else ""
        seeds = ", ".join(str(x["seed"]) for x in new["seeds"])
        plateau_cell = "not on every seed"
        one = new["seeds"][0] if len(new["seeds"]) == 1 else None
        if one:  # one seed: its figures, no spread
            for field in (
                "final_val_acc_at_recipe_epochs",
                "best_val_acc_by_recipe_epochs",
                "best_val_acc",
                "reach_epoch",
                "rise_over_last_window",
                "plateau_epoch",
                "plateau_val_acc",
            ):
                new[field] = one[field]
        if new.get("plateau_epoch") is not None:
            plateau_cell = f"{_pm(new['plateau_epoch'], 1, 0)}, {_pm(new['plateau_val_acc'])}"
        rows.append(
            f"| {model} | {new['lr']} | {new['warmup']} | {seeds} | {new['run_epochs']} "
            f"| {new['epochs']} "
            f"| {_pm(new.get('final_val_acc_at_recipe_epochs'))} "
            f"| {_pm(new.get('best_val_acc_by_recipe_epochs'))} "
            f"| {_pm(new.get('best_val_acc'))} "
            f"| {_pm(new.get('reach_epoch'), 1, 0)} (max {epochs}) "
            f"| {_pm(new.get('rise_over_last_window'))} "
            f"| {plateau_cell} |"
        )
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", help=f"any of {', '.join(GROUPS)}")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--report", action="store_true")
    parser.add_argument(
        "--tree",
        type=Path,
        default=ROOT,
        help="the source tree the runs import adaqp from (a snapshot that others' edits "
        "do not change mid-sweep)",
    )
    args = parser.parse_args()
    runs = json.loads(RUNS.read_text()) if RUNS.exists() else {}
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown groups {unknown}; known: {', '.join(GROUPS)}")
    todo = [s for g in args.groups for s in GROUPS[g] if key(s) not in runs]
    with ThreadPoolExecutor(args.jobs) as pool:
        for future in as_completed([pool.submit(_run, s, args.tree) for s in todo]):
            k, result = future.result()
            runs = _record(k, result)  # after each: resumable
            print(k, "failed" if isinstance(result, str) else "done", flush=True)
    if args.report:
        (HERE / "plateaus.json").write_text(json.dumps(report(runs), indent=1) + "\n")
        recipes = table(runs, RECIPES)
        (HERE / "recipes.json").write_text(json.dumps(recipes, indent=1) + "\n")
        print(markdown(recipes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
