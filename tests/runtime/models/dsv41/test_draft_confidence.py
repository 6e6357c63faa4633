"""The confidence head picks how many of a round's drafts are verified: while the chance that every draft so far is
accepted (the product of sigmoid(c_i)) is worth a verify row."""

from __future__ import annotations

import math

import torch
from tfc.runtime.models.dsv41.dspark.drafter import Draft, greedy_rows
from tfc.runtime.models.dsv41.dspark.drafting import VERIFY_FLOOR, DsparkSlots, SlotAsk, worth_verifying


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_drafts_are_verified_while_their_joint_chance_is_worth_a_row():
    sure = torch.tensor([_logit(0.99)] * 5)
    assert worth_verifying(sure, 5) == 5
    # 0.9, then 0.9 * 0.5 = 0.45, 0.45 * 0.2 = 0.09 < 0.1: two are worth a row
    assert worth_verifying(torch.tensor([_logit(0.9), _logit(0.5), _logit(0.2), _logit(0.99), 0.0]), 5) == 2
    assert worth_verifying(torch.tensor([_logit(0.05), 9.0]), 2) == 0  # the first is unlikely: none
    assert worth_verifying(None, 4) == 4  # no confidence head: every draft
    assert VERIFY_FLOOR == 0.1


class Stub:
    """A drafter whose block comes with given confidence logits."""

    block_size, target_layers = 5, (0,)

    def __init__(self, confidence):
        self.confidence = confidence
        self.config = type("Config", (), {"sliding_window": 8, "hidden_size": 2})()

    def draft_many(self, inputs, choose):
        return [Draft(tuple(range(10, 10 + k)), torch.zeros(k, 4), torch.zeros(5, 4), self.confidence)
                for *_, k in inputs]  # fmt: skip


def test_a_slot_proposes_only_the_drafts_worth_verifying():
    conf = torch.tensor([_logit(0.9), _logit(0.9), _logit(0.1), 4.0, 4.0])
    slots = DsparkSlots(Stub(conf))
    slots.commit(0, 0, torch.zeros(3, 2))
    assert slots.propose([SlotAsk(0, (1, 2, 3), 4, 5)], greedy_rows) == [(10, 11)]  # 0.9, 0.81, then 0.081
    full = DsparkSlots(Stub(None))
    full.commit(0, 0, torch.zeros(3, 2))
    assert full.propose([SlotAsk(0, (1, 2, 3), 4, 5)], greedy_rows) == [(10, 11, 12, 13, 14)]
