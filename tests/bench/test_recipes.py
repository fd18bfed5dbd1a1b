"""The benchmark recipes (adaqp.bench.SIGNAL_RECIPES): what the cluster benchmark trains by."""

from __future__ import annotations

import argparse

import pytest

from adaqp.bench import (
    CLUSTER_CONFIG,
    MODEL_SETTINGS,
    SIGNAL_CONFIG,
    SIGNAL_RECIPES,
    cluster,
    merge_overrides,
    signal_recipe,
)
from adaqp.config import load_config


@pytest.mark.parametrize("model", sorted(MODEL_SETTINGS))
def test_every_model_has_a_recipe_the_config_takes(model):
    recipe = signal_recipe(SIGNAL_CONFIG, model)
    assert recipe is SIGNAL_RECIPES[model]
    # The recipe comes after MODEL_SETTINGS: its rate replaces GAT's 0.005.
    overrides = merge_overrides((*MODEL_SETTINGS[model], *recipe.overrides()))
    train = load_config(SIGNAL_CONFIG, overrides).train
    assert (train.lr, train.lr_warmup_epochs) == (recipe.lr, recipe.lr_warmup_epochs)


def test_gcn_is_the_default_and_other_workloads_keep_their_configs():
    assert signal_recipe(SIGNAL_CONFIG, None) is SIGNAL_RECIPES["gcn"]
    assert signal_recipe(CLUSTER_CONFIG, "sage") is None


def test_epochs_default_to_none_so_the_recipe_decides():
    parser = argparse.ArgumentParser()
    cluster.add_arguments(parser)
    assert parser.parse_args([]).epochs is None
    assert parser.parse_args(["--epochs", "7"]).epochs == 7
