"""HostStage: small int64 uploads through a kept page-locked buffer, each valid until the next."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tfc.runtime.models.dsv41.fast.kv.memory import HostStage


def test_on_the_cpu_an_upload_is_its_own_copy():
    stage = HostStage(torch.device("cpu"))
    values = np.arange(5)
    got = stage.send(values)
    values[:] = 0
    assert got.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_uploads_in_turn_each_reach_what_read_them():
    stage = HostStage(torch.device("cuda"))
    sink = torch.zeros(3, 9000, dtype=torch.int64, device="cuda")
    torch.cuda._sleep(50_000_000)  # a busy stream: the copies queue behind it
    for i, n in enumerate((7, 9000, 100)):  # the second outgrows the first buffer
        sink[i, :n].copy_(stage.send(np.arange(n) + 1000 * i))
    torch.cuda.synchronize()
    for i, n in enumerate((7, 9000, 100)):
        assert sink[i, :n].tolist() == (np.arange(n) + 1000 * i).tolist()
