"""Measures the OGB fixture of the products-scale synthetic graph: writing it, and loading
it through the ``ogbn-products`` loader. One measurement per process, printed as one JSON
line (peak resident memory is the process's ``ru_maxrss``, so each run needs a fresh one).

    python measure.py write --root DIR [--config configs/products-scale-sage.toml]
    python measure.py load --root DIR [--parser-from FILE]

``load`` parses the raw files where ``DIR/ogbn_products`` holds no cache (and writes it),
else reads the cache. ``--parser-from`` takes ``_parse_ogb_raw`` from another copy of
``adaqp/data/ogb.py`` (e.g. ``git show COMMIT:adaqp/data/ogb.py``, from before the csv
parse moved to ``adaqp/data/ogb_csv.py``): the baseline.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import time
from pathlib import Path

from adaqp.data import ogb
from adaqp.data.graph import GRAPH_ARRAYS
from adaqp.data.load import load_dataset


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip()


def _disk_bytes(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def write(root: Path, config: str) -> dict:
    from adaqp.config import load_config
    from adaqp.data.ogb_fixture import write_ogb_fixture

    data = load_config(config).data
    t0 = time.perf_counter()
    graph = load_dataset("synthetic", synthetic=data.synthetic, split_seed=data.split_seed)
    generate_s, generate_peak = time.perf_counter() - t0, _peak_mib()
    t0 = time.perf_counter()
    folder = write_ogb_fixture(graph, root, written_by=f"{__file__} write --config {config}")
    sizes = _disk_bytes(folder)
    return {
        "generate_s": round(generate_s, 1),
        "generate_peak_mib": round(generate_peak),
        "write_s": round(time.perf_counter() - t0, 1),
        "peak_mib": round(_peak_mib()),
        "graph_bytes": sum(getattr(graph, k).nbytes for k in GRAPH_ARRAYS),
        "disk_bytes": sum(sizes.values()),
        "files": sizes,
    }


def load(root: Path, parser_from: str | None) -> dict:
    if parser_from:
        spec = importlib.util.spec_from_file_location("ogb_baseline", parser_from)
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)
        # The csv parse is ogb.parse_csv_layout(directory, files) now; the baseline's
        # _parse_ogb_raw(directory, meta, files) never read its meta.
        ogb.parse_csv_layout = lambda directory, files: baseline._parse_ogb_raw(
            directory, None, files
        )
    cached = (root / "ogbn_products" / ogb._CACHE_NAME).is_file()
    before = _peak_mib()
    t0 = time.perf_counter()
    graph = load_dataset("ogbn-products", root=root)
    wall = time.perf_counter() - t0
    peak = _peak_mib()
    arrays = sum(getattr(graph, k).nbytes for k in GRAPH_ARRAYS)
    return {
        "from_cache": cached,
        "parser_from": parser_from,
        "load_s": round(wall, 1),
        "peak_mib": round(peak),
        "peak_before_load_mib": round(before),
        "arrays_bytes": arrays,
        "peak_over_arrays": round(peak * 2**20 / arrays, 3),
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "source": graph.info["source"],
        # After the peak was read: the loaded graph is the written one, bit for bit.
        "same_as_written": graph.fingerprint()
        == graph.info["synthetic_fixture"]["expected_fingerprint"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("write", "load"))
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--config", default="configs/products-scale-sage.toml")
    parser.add_argument("--parser-from", help="a copy of adaqp/data/ogb.py to parse with")
    args = parser.parse_args()
    record = {
        "what": args.what,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
    }
    if args.what == "write":
        record.update(write(args.root, args.config))
    else:
        record.update(load(args.root, args.parser_from))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
