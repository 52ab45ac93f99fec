"""The contacts claim's read-out and judge: stub models with known maps, and measurements that must fail."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from attnlab.data.potts import PottsConfig, family_set
from attnlab.lab.claims import all_passed
from attnlab.lab.exp_contacts import ContactClaimConfig, contact_models, judge_contacts, measure_contacts

POTTS = PottsConfig(length=24, depth=64, burn_in=30, thin=2, chains=32)
CFG = ContactClaimConfig(potts=POTTS, train_families=4, fit_families=3, test_families=3, minutes=0.02, rows=32,
                         batch_size=2, threads=1)


class MapTask:
    """row_maps gives each family's true contact map (an oracle head) or noise, looked up by the MSA."""

    def __init__(self, cfg: ContactClaimConfig, noise: bool = False):
        rng = np.random.default_rng(0)
        fams = family_set(cfg.potts, "fit", cfg.fit_families) + family_set(cfg.potts, "test", cfg.test_families)
        L = cfg.potts.length
        self.maps = {f.msa.tobytes(): (rng.random((1, 2, L, L)) if noise else
                                       np.stack([f.contacts, rng.random((L, L))])[None].astype(float))
                     for f in fams}                                            # (layers=1, H=2, L, L)

    def row_maps(self, model, msa):
        return self.maps[np.asarray(msa).tobytes()]


class Constant:
    """A model whose predictions ignore its input: its categorical Jacobian is zero everywhere."""

    def predict(self, rows):
        return torch.zeros(*rows.shape, POTTS.symbols)


def test_an_oracle_head_is_read_out_and_a_blind_ablation_stays_at_chance():
    m = measure_contacts(Constant(), Constant(), MapTask(CFG), CFG)
    assert m["top_k"] == 4 and m["families"] == {"fit": 3, "test": 3}
    assert m["mean"]["attention"] == 1.0                                         # the regression found head 0
    assert m["mean"]["ablation_jacobian"] <= 0.5 and m["mean"]["dca"] > m["mean"]["base_rate"]
    assert all_passed(judge_contacts(m, CFG.base_ratio, CFG.ablation_ratio))


def test_noise_maps_fail_the_judge():
    m = measure_contacts(Constant(), Constant(), MapTask(CFG, noise=True), CFG)
    checks = judge_contacts(m, 10.0, CFG.ablation_ratio)
    assert not checks[0].passed and "vs" in checks[0].measured


@pytest.mark.parametrize("attention, base, ablation, fails", [
    (0.20, 0.07, 0.05, 0),        # 2.9x the base rate: short of 3x
    (0.30, 0.07, 0.16, 1),        # 1.9x the ablation: short of 2x
    (0.00, 0.00, 0.00, 1),        # nothing read out: never a pass
])
def test_the_judge_fails_each_shortfall(attention, base, ablation, fails):
    m = {"mean": {"attention": attention, "base_rate": base, "ablation_jacobian": ablation}}
    checks = judge_contacts(m, 3.0, 2.0)
    assert not checks[fails].passed and not all_passed(checks)


def test_models_are_trained_once_then_reused(tmp_path):
    cfg = replace(CFG, minutes=0.01)
    first = contact_models(cfg, tmp_path)
    assert first["attention"].cfg.row == "attention" and first["mean"].cfg.row == "mean"
    assert all(p["source"].startswith("trained now") for p in first["provenance"].values())
    again = contact_models(cfg, tmp_path)
    assert all(p["source"].startswith("reused") for p in again["provenance"].values())
    other = contact_models(replace(cfg, seed=1), tmp_path)                      # another config: trained again
    assert all(p["source"].startswith("trained now") for p in other["provenance"].values())
