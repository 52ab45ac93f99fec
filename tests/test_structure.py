"""One name per concept (issue #29): what the library computes and what the bench times are the same thing."""
import pytest
import torch

from attnlab.bench.cases import Case, attnlab_mask, flex_mods
from attnlab.positional import ALiBi


@pytest.mark.parametrize("H", range(1, 17))
def test_the_bench_alibi_is_the_library_alibi(H):
    case = Case("alibi", 12, "float32", "fwd", heads=H)
    _, bench = attnlab_mask(case)
    library = ALiBi(H).bias()
    torch.testing.assert_close(bench.dense(12, 12).double(), library.dense(12, 12).double(), rtol=1e-6, atol=0)
    _, score_mod = flex_mods(case)
    flex = torch.stack([torch.stack([torch.stack([score_mod(torch.tensor(0.0), 0, h, torch.tensor(i), torch.tensor(j))
                                                  for j in range(12)]) for i in range(12)]) for h in range(H)])
    torch.testing.assert_close(flex.double(), library.dense(12, 12).double().reshape(H, 12, 12), rtol=1e-6, atol=0)
