"""docs/attention.md runs: its python blocks are executed in order, and the numbers it quotes are checked."""

import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "attention.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_doc_runs_and_its_numbers_hold(capsys):
    text = DOC.read_text()
    blocks = python_blocks(text)
    assert len(blocks) >= 12
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name}[block {i}]", "exec"), namespace)
    expected = {
        "journey_scores": [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865],
        "journey_weights": [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
        "journey_context": [0.4419, 0.6515, 0.5683],
    }
    out = capsys.readouterr().out
    for name, values in expected.items():
        torch.testing.assert_close(namespace[name], torch.tensor(values), atol=5e-5, rtol=0,
                                   msg=lambda m: f"{name}: {m}")
        printed = "tensor([" + ", ".join(f"{x:.4f}" for x in values) + "])"
        assert printed in out and f"# {printed}" in text, name  # printed as the doc says it is
    assert "76.6% of the 128x128 blocks are skipped" in out
    assert "torch.Size([96, 32]) torch.Size([48, 32])" in out
    assert "[0.2, 0.3555]\n48\n" in out  # diff: lambda_init per layer, 3 x head_dim parameters per layer
    assert "1152 1152\n" in out  # linear: the decode state does not grow
    assert "160 512\n" in out  # mla: (d_c + d_R) x layers x 4 bytes per token against 2 x n_head x D x ...


def test_the_kernel_table_lists_every_kernel():
    from gpt import kernels as attention

    table = DOC.read_text().split("## Kernels")[1].split("\n## ")[0]
    listed = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert listed == ["manual", "einsum", "heads", "sdpa", "flex"]
    assert sorted(listed) == attention.available()
