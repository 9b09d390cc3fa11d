"""``python -m gpt.attention``: the measured table of kernels and options on this device."""

import pytest

from gpt import kernels as attention
from gpt.attention.__main__ import main
from gpt.kernels import registry, support


def test_lists_every_kernel_with_what_runs_on_cpu(capsys):
    main(["cpu"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0] in attention.available()}
    assert sorted(rows) == attention.available()
    header = next(line.split() for line in out.splitlines() if line.startswith("kernel"))
    table = {name: dict(zip(header, cells)) for name, cells in rows.items()}
    for name in ("manual", "einsum", "heads", "sdpa"):
        assert all(table[name][c] == "yes" for c in ("forward", "backward", "gqa", "window", "mask", "dropout")), name
    assert table["flex"]["forward"] == "yes" and table["flex"]["backward"] == "no" and table["flex"]["dropout"] == "no"
    assert "no backward: attention=flex has no backward pass on CPU" in out
    for name in ("manual", "einsum", "heads"):  # the score variants: where the kernel forms the scores itself
        assert all(table[name][c] == "yes" for c in ("softcap", "bias", "sink")), name
    assert (table["sdpa"]["softcap"], table["sdpa"]["bias"], table["sdpa"]["sink"]) == ("no", "yes", "no")
    for name in ("softcap", "alibi", "qk_norm", "diff", "linear", "mla"):
        assert f"model.designs=[{name}]" in out, name
    assert "cap=15.0" in out and "latent=32 rope_dim=null" in out  # each design's settings with their defaults
    sdpa_backends = out.split("sdpa")[1].splitlines()[0]
    assert "math" in sdpa_backends and "efficient" not in sdpa_backends  # the efficient kernel is CUDA-only


@pytest.fixture(scope="module")
def cpu_table() -> dict[str, dict]:
    return {row["kernel"]: row for row in support.support_table("cpu")}


def test_each_kernel_declares_what_it_does_on_cpu(cpu_table):
    for name, row in cpu_table.items():
        declared = attention.spec(name)
        measured = {option: row[option] == "yes" for option in support.COLUMNS}
        assert measured == {"forward": True, "backward": declared.trains("cpu"),
                            **{option: declared.supports(option) for option in registry.OPTIONS}}, (name, row["why"])
        assert row["disagrees"] == [], name
    assert not attention.spec("flex").supports("dropout") and not attention.spec("flex").trains("cpu")


def test_a_declaration_that_lies_is_caught():
    def refuses_dropout(q, k, v, dropout_p=0.0, **kw):
        if dropout_p:
            raise ValueError("no dropout here")
        return attention.get("manual")(q, k, v, **kw)

    attention.register("liar", options=registry.OPTIONS)(refuses_dropout)  # claims everything, dropout included
    attention.register("modest", options=("gqa", "mask", "dropout", *registry.EXTENSIONS))(  # has a window too
        attention.get("manual"))
    try:
        assert support.measure_row("liar", "cpu")["disagrees"] == ["declares dropout supported but measured 'no'"]
        assert support.measure_row("modest", "cpu")["disagrees"] == ["declares window unsupported but measured 'yes'"]
    finally:
        registry.unregister("liar")
        registry.unregister("modest")


@pytest.mark.parametrize("argv, said", [(["--help"], None), (["nope"], "error: unknown device 'nope'"),
                                        (["cpu", "extra"], "error: python -m gpt.attention takes one device at most")])
def test_help_and_bad_arguments_get_a_usage_or_one_error_line(capsys, argv, said):
    if said is None:
        main(argv)
        assert capsys.readouterr().out.startswith("usage: python -m gpt.attention")
        return
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(said) and "Traceback" not in err
