"""``python -m gpt.attention``: the measured table of kernels and options on this device."""

from gpt import attention
from gpt.attention.__main__ import main


def test_lists_every_kernel_with_what_runs_on_cpu(capsys):
    main(["cpu"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split() and line.split()[0] in attention.available()}
    assert sorted(rows) == attention.available()
    header = next(line.split() for line in out.splitlines() if line.startswith("kernel"))
    table = {name: dict(zip(header, cells)) for name, cells in rows.items()}
    for name in ("manual", "einsum", "heads", "sdpa"):
        assert all(table[name][c] == "yes" for c in ("forward", "backward", "gqa", "window", "mask", "dropout")), name
    assert table["flex"]["forward"] == "yes" and table["flex"]["backward"] == "no" and table["flex"]["dropout"] == "no"
    assert "no backward: attention=flex has no backward pass on CPU" in out
    sdpa_backends = out.split("sdpa")[1].splitlines()[0]
    assert "math" in sdpa_backends and "efficient" not in sdpa_backends  # the efficient kernel is CUDA-only
