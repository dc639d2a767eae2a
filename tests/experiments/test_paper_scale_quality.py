"""Table 1's quality column (``python -m csd.experiments.paper_scale --fid N``): shards merged in image order
(each image once, or an error naming the ones missing or repeated), the Frechet distance of a known pair of
Gaussians, the Inception Score of known logits, and the whole path on tiny official-format models with a
stand-in feature network, resumed from its shards. Nothing is downloaded: a missing statistics file, package
or weight file is named."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from csd.config import SamplingConfig
from csd.experiments.paper_scale import command
from csd.experiments.paper_scale import plan as grid
from csd.experiments.paper_scale.quality import (
    QualityConfig,
    inception_score,
    merge_shards,
    quality_row,
    shard_path,
)
from scripts.random_official import TINY, tiny_configs, write_official


def _write(shards, pair, sampler, start, pool, logits=None, accepted=0, verified=0):
    shards.mkdir(parents=True, exist_ok=True)
    chunk = {"index": np.arange(start, start + len(pool)), "pool": pool, "accepted": accepted, "verified": verified}
    if logits is not None:
        chunk["logits"] = logits
    np.savez(shard_path(shards, pair, sampler, start), **chunk)


def test_shards_merge_in_image_order_whatever_wrote_them(tmp_path):
    g = np.random.default_rng(0)
    pool, logits = g.normal(size=(10, 3)), g.normal(size=(10, 5))
    for start in (8, 0, 4):  # written out of order, as ranks finish
        _write(
            tmp_path, "MAR-L / MAR-B", "CSD, gamma 8", start, pool[start : start + 4], logits[start : start + 4], 1, 2
        )
    merged = merge_shards(tmp_path, "MAR-L / MAR-B", "CSD, gamma 8", 10)
    np.testing.assert_array_equal(merged["pool"], pool)
    np.testing.assert_array_equal(merged["logits"], logits)
    assert merged["accepted"] == 3 and merged["verified"] == 6


def test_a_missing_or_repeated_image_is_named(tmp_path):
    pool = np.zeros((4, 2))
    _write(tmp_path, "p", "s", 0, pool)
    with pytest.raises(ValueError, match=r"missing \[4, 5, 6, 7\], repeated \[\]"):
        merge_shards(tmp_path, "p", "s", 8)
    _write(tmp_path, "p", "s", 4, pool)
    _write(tmp_path, "p", "s", 2, pool[:2])
    with pytest.raises(ValueError, match=r"missing \[\], repeated \[2, 3\]"):
        merge_shards(tmp_path, "p", "s", 8)
    with pytest.raises(FileNotFoundError, match="no shards of p, other"):
        merge_shards(tmp_path, "p", "other", 8)


def test_the_frechet_distance_of_two_known_gaussians():
    """N(0, I) features against reference N(mu, diag(s^2)): ||mu||^2 + sum(1 + s^2 - 2 s), here 2.5."""
    g = np.random.default_rng(1)
    mu, s = np.array([1.0, 0.0, 0.5, 0.0]), np.array([1.0, 2.0, 1.0, 0.5])
    merged = {"pool": g.normal(size=(40000, 4)), "logits": None, "accepted": 0, "verified": 0}
    row = quality_row(merged, (mu, np.diag(s**2)))
    expected = float(mu @ mu + np.sum(1 + s**2 - 2 * s))
    assert row["fid"] == pytest.approx(expected, abs=0.05) and expected == pytest.approx(2.5)
    assert row["images"] == 40000 and row["acceptance"] is None and "inception_score" not in row


def test_the_inception_score_of_known_logits():
    """Confident and uniform over k classes: k; the same distribution for every image: 1."""
    confident = np.full((50, 5), -30.0)
    confident[np.arange(50), np.arange(50) % 5] = 30.0
    assert inception_score(confident, splits=5)[0] == pytest.approx(5.0, rel=1e-6)
    assert inception_score(np.zeros((50, 5)), splits=5) == pytest.approx((1.0, 0.0))


def test_nothing_is_generated_without_the_statistics_file(tmp_path, capsys):
    args = ["--fid", "8", "--fid-stats", str(tmp_path / "none.npz"), "--checkpoints", str(tmp_path)]
    with pytest.raises(SystemExit):
        command.main(args + ["--out", str(tmp_path / "out")])
    assert "reference statistics (.npz with mu and sigma) not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        command.main(["--fid", "8", "--fid-stats", str(tmp_path / "none.npz")])
    assert "--fid needs --checkpoints" in capsys.readouterr().err


def test_a_missing_feature_package_or_weight_file_is_named(tmp_path):
    cfg = QualityConfig(8, tmp_path / "s.npz", tmp_path, inception=tmp_path / "pt_inception.pth")
    with pytest.raises(FileNotFoundError, match="Inception weights not found"):
        cfg.features(torch.device("cpu"))
    (tmp_path / "pt_inception.pth").write_bytes(b"")
    with pytest.raises(ImportError, match="needs the optional package 'torch-fidelity'"):
        QualityConfig(8, tmp_path / "s.npz", tmp_path, tmp_path / "pt_inception.pth", "torch-fidelity").features(
            torch.device("cpu")
        )


def stand_in_features(images: torch.Tensor):
    """Pool features: the mean colour of each image quarter (12); logits: a fixed projection of them (7)."""
    b = images.shape[0]
    pool = images.reshape(b, 3, 2, images.shape[2] // 2, 2, images.shape[3] // 2).mean(dim=(3, 5))
    pool = pool.reshape(b, 12).double().numpy()
    return pool, pool @ np.random.default_rng(0).normal(size=(12, 7))


@pytest.mark.slow
def test_table_1s_quality_column_end_to_end_on_tiny_official_models(tmp_path, monkeypatch, capsys):
    checkpoints, out = tmp_path / "checkpoints", tmp_path / "out"
    stats = tmp_path / "ref.npz"
    np.savez(stats, mu=np.zeros(12), sigma=np.eye(12))
    monkeypatch.setattr(QualityConfig, "features", lambda self, device: stand_in_features)
    short = lambda pair, tiny, precision: SamplingConfig(num_steps=4, cfg_scale=2.0, head_steps=3, precision=precision)
    monkeypatch.setattr(grid, "sampling_for", short)  # the published 64 x 100 steps take minutes on a CPU
    args = ["--families", "mar", "--pairs", "L/B", "--batches", "2", "--gammas", "2", "--repeats", "1"]
    args += ["--warmup", "0", "--checkpoints", str(checkpoints), "--out", str(out), "--device", "cpu"]
    args += ["--fid", "6", "--fid-stats", str(stats), "--fid-batch", "4"]
    with tiny_configs():
        write_official(checkpoints, {n: TINY[n] for n in ("mar_base", "mar_large")})
        result = command.main(args)
        first = capsys.readouterr().out
        again = command.main(args)  # every chunk is there: nothing is generated twice
    assert "4 chunks of 4 images made" in first and "0 chunks of 4 images made" in capsys.readouterr().out
    (pair,) = result["pairs"]
    assert set(pair["quality"]) == {"target only", "CSD, gamma 2"}
    for row in pair["quality"].values():
        assert row["images"] == 6 and np.isfinite(row["fid"]) and row["inception_score"] >= 1.0
    assert pair["quality"]["CSD, gamma 2"]["acceptance"] is not None
    assert again["pairs"][0]["quality"] == pair["quality"]  # the same shards, the same numbers
    written = json.loads((out / "paper_scale.json").read_text())
    assert written["fid"]["n"] == 6 and written["pairs"][0]["quality"]
    assert "| CSD, gamma 2 |" in (out / "paper_scale.md").read_text()
