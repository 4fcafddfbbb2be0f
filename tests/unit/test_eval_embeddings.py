"""Anisotropy and STS correlation on vectors whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest

from bertcore.eval.embeddings import anisotropy, sts_spearman
from bertcore.eval.metrics import cosine_rows
from bertcore.rng import keyed_numpy


def test_cosine_rows_by_hand():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    b = np.array([[0.0, 2.0], [2.0, 2.0], [1.0, 0.0]])
    assert cosine_rows(a, b).tolist() == pytest.approx([0.0, 1.0, 0.0])  # a zero vector scores 0


def test_anisotropy_extremes():
    same_direction = np.tile([[1.0, 2.0, 3.0]], (10, 1)) * np.arange(1, 11)[:, None]
    assert anisotropy(same_direction, keyed_numpy(0, "t")) == pytest.approx(1.0)
    two = np.array([[1.0, 0.0], [1.0, 1.0]])  # pairs are always of different rows
    assert anisotropy(two, keyed_numpy(0, "t"), num_pairs=50) == pytest.approx(1 / np.sqrt(2))
    isotropic = keyed_numpy(1, "vectors").standard_normal((500, 256))
    assert abs(anisotropy(isotropic, keyed_numpy(0, "t"), num_pairs=2000)) < 0.02
    shifted = isotropic + 3.0  # a common offset, the typical cause of anisotropy
    assert anisotropy(shifted, keyed_numpy(0, "t"), num_pairs=2000) > 0.8
    with pytest.raises(ValueError):
        anisotropy(isotropic[:1], keyed_numpy(0, "t"))


def test_anisotropy_is_seeded():
    vectors = keyed_numpy(2, "vectors").standard_normal((50, 8))
    first = anisotropy(vectors, keyed_numpy(5, "pairs"), num_pairs=30)
    assert first == anisotropy(vectors, keyed_numpy(5, "pairs"), num_pairs=30)
    assert first != anisotropy(vectors, keyed_numpy(6, "pairs"), num_pairs=30)


def test_sts_spearman_ranks_cosines_against_gold():
    angles = np.linspace(0.1, 1.4, 8)
    a = np.tile([[1.0, 0.0]], (8, 1))
    b = np.stack([np.cos(angles), np.sin(angles)], axis=1)  # cosine falls as the angle grows
    gold = 5.0 - angles
    assert sts_spearman(a, b, gold) == pytest.approx(1.0)
    assert sts_spearman(a, b, -gold) == pytest.approx(-1.0)
    swapped = gold.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # one adjacent swap of 8: rho = 1 - 6*2/(8*63)
    assert sts_spearman(a, b, swapped) == pytest.approx(1 - 12 / 504)
