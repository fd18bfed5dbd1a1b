"""The synthetic dataset: a seeded contextual stochastic block model.

:class:`SyntheticSpec` holds the generator's parameters and :func:`generate_synthetic`
samples the graph (``load_dataset("synthetic")``). How METIS cuts it with and without
communities (edge cut, halo rows per node, central nodes) is tabulated in
``docs/datasets.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from adaqp.data.graph import GraphData, csr_from_edges

logger = logging.getLogger(__name__)

_BLOCK = 1 << 20
"""Rows or edges per block where a pass over the graph runs block by block."""


@dataclass(frozen=True)
class SyntheticSpec:
    """Parameters of the contextual stochastic block model behind ``load_dataset("synthetic")``.

    Class centres are random unit-norm vectors, so with ``feature_noise=1`` features alone
    are only weakly informative and neighbourhood aggregation is needed for high accuracy.

    Without communities the graph has no locality beyond its classes, so METIS cuts many
    of its edges. ``communities`` and ``inter_community`` add the community structure of
    real graphs, where METIS finds locality: ``communities=32, inter_community=0.04`` is
    ``configs/synthetic-local-gcn.toml`` (both cut in ``docs/datasets.md``).
    """

    num_nodes: int = 10000
    """Number of nodes N (classes are balanced)."""
    num_classes: int = 8
    """Number of classes C (at least 2)."""
    avg_degree: float = 20.0
    """Average undirected degree after symmetrisation. Without communities it is approximate
    (duplicate draws are dropped, a few percent under a power law); with communities exact."""
    homophily: float = 0.7
    """Probability that an edge's endpoints share a class."""
    feature_dim: int = 64
    """Feature dimension F."""
    feature_noise: float = 1.0
    """Standard deviation of the Gaussian noise around the class centres."""
    power_law: float = 0.0
    """0: roughly uniform degrees; > 1: degree propensity ~ Pareto density w^-power_law."""
    communities: int = 0
    """Number of communities K; 0 = none, the generator as it was before communities (same
    graph for the same seed). Each community holds an equal share of every class, so its
    (community, class) cells are small communities nested within the classes; labels and
    homophily keep their meaning. Hubs are capped near their community's size (N / K)."""
    inter_community: float = 0.04
    """With K > 0: fraction of edges whose endpoints lie in different communities (the other
    community is uniform, so these are the long-range edges METIS must cut); the rest join
    nodes of one community. Unused when K = 0."""
    seed: int = 0
    """Seed of the graph, features and labels."""
    train_fraction: float = 0.1
    """Fraction of nodes in the training set."""
    val_fraction: float = 0.1
    """Fraction of nodes in the validation set."""
    test_fraction: float = 0.2
    """Fraction of nodes in the test set."""

    def __post_init__(self) -> None:
        ints = ("num_nodes", "num_classes", "feature_dim", "communities", "seed")
        for key in ints:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"SyntheticSpec.{key} must be an int, got {value!r}")
        checks = {
            "num_classes": self.num_classes >= 2,
            "num_nodes": self.num_nodes >= self.num_classes,
            "avg_degree": 0 < self.avg_degree < self.num_nodes - 1,
            "homophily": 0.0 <= self.homophily <= 1.0,
            "feature_dim": self.feature_dim >= 1,
            "feature_noise": self.feature_noise >= 0.0,
            "power_law": self.power_law == 0.0 or self.power_law > 1.0,
            # Every (community, class) cell must hold a node; one community is no locality;
            # edge keys (N^2 * 4) must fit in int64.
            "communities": self.communities == 0
            or (
                2 <= self.communities <= self.num_nodes // self.num_classes
                and self.num_nodes <= 1_500_000_000
            ),
            "inter_community": 0.0 <= self.inter_community <= 1.0,
            "seed": self.seed >= 0,
            "train_fraction": 0.0 < self.train_fraction <= 1.0,
            "val_fraction": 0.0 <= self.val_fraction <= 1.0,
            "test_fraction": 0.0 <= self.test_fraction <= 1.0,
        }
        total = self.train_fraction + self.val_fraction + self.test_fraction
        checks["test_fraction"] = checks["test_fraction"] and total <= 1.0 + 1e-9
        for key, ok in checks.items():
            if not ok:
                raise ValueError(f"SyntheticSpec.{key}={getattr(self, key)!r} is invalid")


def generate_synthetic(spec: SyntheticSpec, split_seed: int = 0) -> GraphData:
    """Samples a contextual SBM graph; the same ``spec`` gives the same graph.

    ``N * avg_degree / 2`` edges are drawn and then symmetrised. Each edge's source is
    weighted by degree propensity; its target class is the source's with probability
    ``homophily``, else a uniform other class. Without communities the target is drawn
    from the whole target class and duplicate draws are dropped. With ``communities = K``
    it is drawn from the target class's cell in the source's community, or with
    probability ``inter_community`` in a uniform other community; duplicates are redrawn
    with the same kind (same or other class, same or other community), so the graph has
    exactly ``round(N * avg_degree / 2)`` undirected edges in the sampled proportions.
    Within its class or cell the target is weighted by propensity. The split is a random
    fractional one seeded by ``(spec.seed, split_seed)``.
    """
    n, c, k = spec.num_nodes, spec.num_classes, spec.communities
    rng = np.random.default_rng(spec.seed)
    labels = rng.permutation(np.arange(n, dtype=np.int64) % c)
    order = np.argsort(labels, kind="stable")  # nodes grouped by class
    class_ptr = np.zeros(c + 1, dtype=np.int64)
    np.cumsum(np.bincount(labels, minlength=c), out=class_ptr[1:])
    # Targets are drawn from a contiguous range of `order`: a class, or a (community,
    # class) cell. Cells need no random draws, so K = 0 consumes the generator as it did
    # before communities existed and gives the same graph.
    group_ptr = class_ptr
    if k:
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n, dtype=np.int64) - class_ptr[labels[order]]
        # Node ids within a class are random, so rank-based communities are random sets
        # holding an equal share (to one node) of every class.
        community = rank * k // np.diff(class_ptr)[labels]
        del rank
        cell = community * c + labels
        order = np.argsort(cell, kind="stable")
        group_ptr = np.zeros(k * c + 1, dtype=np.int64)
        np.cumsum(np.bincount(cell, minlength=k * c), out=group_ptr[1:])
        del cell
    m = int(round(n * spec.avg_degree / 2))
    cum = None
    if spec.power_law > 0:
        # numpy's pareto(a) is Lomax with density ~ (1+x)^-(a+1): shift by 1 for classic Pareto.
        weight = 1.0 + rng.pareto(spec.power_law - 1.0, size=n)
        cum = np.zeros(n + 1)
        np.cumsum(weight[order], out=cum[1:])
        del weight

    def draw(count: int, kinds: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Samples ``count`` edges ``(src, dst, kind)``, [count] each, global ids.

        ``kind`` (int8) is 2 * (communities differ) + (classes differ); ``kinds`` forces it.
        Temporaries are freed or reused as soon as they are spent: at ogbn-products' size
        one [count] array is 0.5 GB (the values are those of the plain expressions).
        """
        if cum is not None:
            pos = _locate(cum, rng.random(count) * cum[-1])
            src = order[pos.clip(0, n - 1)]
            del pos
        else:
            src = rng.integers(0, n, size=count, dtype=np.int64)
        target = labels[src]  # target class, then (with communities) target cell
        other = rng.random(count) >= spec.homophily if kinds is None else (kinds & 1) == 1
        shift = rng.integers(1, c, size=int(other.sum()), dtype=np.int64)
        target[other] = (target[other] + shift) % c
        del shift
        kind = other.astype(np.int8)
        del other
        if k:
            target_community = community[src]
            away = rng.random(count) < spec.inter_community if kinds is None else kinds >= 2
            shift = rng.integers(1, k, size=int(away.sum()), dtype=np.int64)
            target_community[away] = (target_community[away] + shift) % k
            del shift
            target_community *= c
            target += target_community
            del target_community
            kind += 2 * away.view(np.int8)
            del away
        lo = group_ptr[target]
        target += 1
        hi = group_ptr[target]
        del target
        if cum is not None:
            pos = _locate(cum, cum[lo] + rng.random(count) * (cum[hi] - cum[lo]))
        else:
            spread = rng.random(count)
            hi -= lo  # the group's size, for now
            spread *= hi
            pos = spread.astype(np.int64)
            del spread
            pos += lo
            hi += lo
        # Rounding can land one past the group end; clamp into the chosen group.
        hi -= 1
        np.clip(pos, lo, hi, out=pos)
        del lo, hi
        dst = order[pos]
        del pos
        return src, dst, kind

    if k:
        pairs = _draw_distinct(draw, m, n)
        homophily, inter = _pair_shares(pairs, n, labels, community)
        indptr, indices = _symmetric_csr(pairs, n)
        del pairs
    else:
        src, dst, _ = draw(m, None)
        homophily = float(np.mean(labels[src] == labels[dst])) if m else 0.0
        inter = 0.0
        indptr, indices = csr_from_edges(src, dst, n, symmetrize=True)
        del src, dst

    centres = rng.standard_normal((c, spec.feature_dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    features = rng.standard_normal((n, spec.feature_dim), dtype=np.float32)
    features *= np.float32(spec.feature_noise)
    centres = centres.astype(np.float32)
    for start in range(0, n, _BLOCK):  # bounded scratch: no second [N, F] array
        features[start : start + _BLOCK] += centres[labels[start : start + _BLOCK]]

    perm = np.random.default_rng([spec.seed, split_seed]).permutation(n)
    fractions = np.cumsum([spec.train_fraction, spec.val_fraction, spec.test_fraction])
    bounds = [0, *np.minimum(np.round(fractions * n), n).astype(int).tolist()]
    masks = [np.zeros(n, dtype=bool) for _ in range(3)]
    for mask, lo, hi in zip(masks, bounds[:-1], bounds[1:], strict=True):
        mask[perm[lo:hi]] = True
    sizes = [int(mask.sum()) for mask in masks]
    info = {
        "source": "synthetic",
        "generator": "contextual_sbm",
        "params": dataclasses.asdict(spec),
        "split_seed": split_seed,
        "split_sizes": sizes,
        "sampled_edges": m,
        "sampled_edge_homophily": homophily,
        "symmetrized": True,
        "metric": "acc",
    }
    if k:
        info["sampled_inter_community"] = inter
    graph = GraphData("synthetic", indptr, indices, features, labels, *masks, c, info=info)
    graph.validate()
    return graph


def _locate(cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Returns ``np.searchsorted(cum, x, side="right") - 1``, computed on sorted queries.

    Searching random queries in a large ``cum`` misses the cache at every step; sorted
    queries walk it in order, for the same result (``docs/datasets.md``).
    """
    perm = np.argsort(x)
    out = np.empty(x.shape[0], dtype=np.int64)
    out[perm] = np.searchsorted(cum, x[perm], side="right")
    out -= 1
    return out


def _edge_keys(drawn: list[np.ndarray], n: int) -> np.ndarray:
    """Sorted distinct ``(min * n + max) * 4 + kind`` of the non-loop edges, int64.

    ``drawn``: ``[src, dst, kind]``, emptied here so that the draws are freed as soon as
    the keys hold them (the caller keeps no reference).
    """
    src, dst, kind = drawn
    drawn.clear()
    keep = src != dst
    keys = np.minimum(src, dst)
    keys *= n
    keys += np.maximum(src, dst)
    del src, dst
    keys *= 4
    keys += kind
    del kind
    if not keep.all():
        keys = keys[keep]
    del keep
    keys.sort()  # np.unique's hash path is several times slower on int64 here
    if keys.size and not (keys[1:] > keys[:-1]).all():
        keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
    return keys


def _contains(sorted_keys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """bool [len(x)]: whether each ``x`` occurs in the sorted array ``sorted_keys``."""
    if sorted_keys.size == 0:
        return np.zeros(x.shape[0], dtype=bool)
    pos = np.searchsorted(sorted_keys, x).clip(max=sorted_keys.shape[0] - 1)
    return sorted_keys[pos] == x


def _draw_distinct(
    draw: Callable[[int, np.ndarray | None], tuple[np.ndarray, np.ndarray, np.ndarray]],
    m: int,
    n: int,
    max_rounds: int = 64,
) -> np.ndarray:
    """Draws ``m`` distinct undirected non-loop edges in the proportions of one draw.

    Dropping duplicates alone would remove mostly edges inside small cells and between
    hubs, skewing homophily and the inter-community share; so the first ``m`` draws fix
    how many edges of each kind (0..3, the third output of ``draw``) there are, and each
    duplicate or self-loop is replaced by a new draw forced to the same kind.

    Returns:
        int64 [m] sorted pairs ``lo * n + hi`` with ``lo < hi``, global ids in [0, n);
        fewer, with a warning, if ``max_rounds`` redraws do not find enough.
    """
    drawn = list(draw(m, None))
    want = np.bincount(drawn[2], minlength=4)
    keys = _edge_keys(drawn, n)  # the kind rides in the low two bits
    have = np.bincount(keys & 3, minlength=4)
    extra = np.zeros(0, dtype=np.int64)  # sorted keys found by redraws, merged at the end
    for _ in range(max_rounds):
        short = want - have
        if not short.any():
            break
        kind = np.repeat(np.arange(4, dtype=np.int64), short)
        new = _edge_keys(list(draw(kind.shape[0], kind)), n)
        new = new[~_contains(keys, new) & ~_contains(extra, new)]
        have += np.bincount(new & 3, minlength=4)
        extra = np.sort(np.concatenate([extra, new]))
    if (want - have).any():
        logger.warning(
            "synthetic graph: %d of %d edges missing after %d redraws; the communities are "
            "too small for this average degree",
            int((want - have).sum()),
            m,
            max_rounds,
        )
    if extra.size:
        keys = np.concatenate([keys, extra])
        keys.sort()
    keys >>= 2
    return keys


def _pair_shares(
    pairs: np.ndarray, n: int, labels: np.ndarray, community: np.ndarray
) -> tuple[float, float]:
    """Shares of the pairs (``lo * n + hi``) whose endpoints share a class, and whose
    endpoints lie in different communities; block by block, in bounded scratch."""
    same_class = other_community = 0
    for start in range(0, pairs.shape[0], _BLOCK):
        lo, hi = np.divmod(pairs[start : start + _BLOCK], n)
        same_class += int(np.count_nonzero(labels[lo] == labels[hi]))
        other_community += int(np.count_nonzero(community[lo] != community[hi]))
    m = max(pairs.shape[0], 1)
    return same_class / m, other_community / m


def _symmetric_csr(pairs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``csr_from_edges(lo, hi, n, symmetrize=True)`` of distinct sorted loop-free pairs
    ``lo * n + hi`` (``lo < hi``), built in a third of its memory.

    Row ``u`` of the CSR holds key ``u * n + v`` for each neighbour ``v``: the pairs are
    already those keys for ``u < v`` in order, their swaps (``hi * n + lo``) the rest, so
    one sort of the swaps and a merge of two sorted runs (``kind="stable"``) order them
    all; distinct loop-free pairs leave nothing to drop.
    """
    m = pairs.shape[0]
    keys = np.empty(2 * m, dtype=np.int64)
    keys[:m] = pairs
    for start in range(0, m, _BLOCK):
        lo, hi = np.divmod(pairs[start : start + _BLOCK], n)
        hi *= n
        hi += lo
        keys[m + start : m + start + hi.shape[0]] = hi
    keys[m:].sort()
    keys.sort(kind="stable")
    indptr = np.searchsorted(keys, np.arange(n + 1, dtype=np.int64) * n).astype(np.int64)
    np.remainder(keys, n if n else 1, out=keys)
    return indptr, keys
