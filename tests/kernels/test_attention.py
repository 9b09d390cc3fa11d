"""Every kernel against a float64 reference written the slow obvious way, over a grid of cases."""

import itertools
import math

import pytest
import torch

from gpt import kernels as attention
from gpt.errors import UserError
from gpt.kernels import registry
from gpt.kernels.masks import causal_mask

KERNELS = attention.available()
BACKWARD = [k for k in KERNELS if attention.spec(k).trains("cpu")]  # not flex: no CPU backward (tested on GPU only)


def reference(q, k, v, causal=True, mask=None, scale=None, window=None):
    """Attention one query at a time in float64: list the keys it may see, softmax, average the values."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, t_q, D = q.shape
    t_k, group = k.size(2), H // k.size(1)
    scale = 1 / math.sqrt(D) if scale is None else scale
    if mask is not None:
        mask = mask.expand(B, H, t_q, t_k)
    rows = []
    for b in range(B):
        for h in range(H):
            for i in range(t_q):
                p = i + t_k - t_q  # the query's position among the keys (bottom-right alignment)
                keys = [
                    j for j in range(t_k)
                    if (not causal or j <= p) and (window is None or j > p - window)
                    and (mask is None or mask[b, h, i, j])
                ]
                if not keys:
                    rows.append(torch.zeros(D, dtype=torch.float64))
                    continue
                scores = torch.stack([q[b, h, i] @ k[b, h // group, j] for j in keys]) * scale
                weights = torch.exp(scores - scores.max())
                weights = weights / weights.sum()
                rows.append(sum(w * v[b, h // group, j] for w, j in zip(weights, keys)))
    return torch.stack(rows).view(B, H, t_q, D)


def make_qkv(B=2, H=4, Hkv=4, Tq=6, Tk=6, D=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, Hkv, Tk, D, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, Hkv, Tk, D, generator=g).to(dtype).requires_grad_()
    return q, k, v


def make_mask(kind, B, H, Tq, Tk):
    """None; key padding (B, 1, 1, Tk) with batch 1 padded at the end; or a random (B, H, Tq, Tk) with an empty row."""
    if kind is None:
        return None
    if kind == "padding":
        mask = torch.ones(B, 1, 1, Tk, dtype=torch.bool)
        mask[1, ..., Tk - 2:] = False
        return mask
    mask = torch.rand(B, H, Tq, Tk, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[0, 0, Tq - 1] = False  # a query that may attend nowhere
    return mask


def grid():
    cases = []
    shapes, heads, masks = [(5, 5), (3, 7)], [(4, 4), (4, 2), (4, 1)], [None, "padding", "random"]
    for causal, (Tq, Tk), (H, Hkv), window, mask in itertools.product([True, False], shapes, heads, [None, 2], masks):
        if window is not None and not causal:
            continue
        scale = 0.3 if len(cases) % 2 else None  # every other case uses a custom scale
        cases.append(dict(causal=causal, Tq=Tq, Tk=Tk, H=H, Hkv=Hkv, window=window, mask=mask, scale=scale))
    return cases


GRID = grid()
# Eager flex on a CPU costs ~0.2 s a call (torch traces it anew for each shape and mask), so flex runs
# every third case: still every option, both shapes, every head ratio, masks, windows and both scales.
FLEX_CASES = [i for i in range(len(GRID)) if (i + i // 3) % 3 == 0]
_expected = {}


def expected(i):
    """Inputs, kwargs, the reference output and its gradients for grid case i (computed once)."""
    if i not in _expected:
        c = GRID[i]
        q, k, v = make_qkv(H=c["H"], Hkv=c["Hkv"], Tq=c["Tq"], Tk=c["Tk"], seed=i)
        mask = make_mask(c["mask"], 2, c["H"], c["Tq"], c["Tk"])
        kw = dict(causal=c["causal"], mask=mask, scale=c["scale"], window=c["window"])
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        out = reference(*leaves, **kw)
        upstream = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)  # non-uniform
        grads = torch.autograd.grad((out * upstream).sum(), leaves)
        _expected[i] = (q, k, v, kw, out, upstream, grads)
    return _expected[i]


def case_id(c):
    return "{}-T{}x{}-H{}/{}-w{}-{}-s{}".format(
        "causal" if c["causal"] else "full", c["Tq"], c["Tk"], c["H"], c["Hkv"], c["window"], c["mask"], c["scale"])


CASES = [(kernel, i) for kernel in KERNELS for i in (FLEX_CASES if kernel == "flex" else range(len(GRID)))]


@pytest.mark.parametrize("kernel, i", CASES, ids=[f"{kernel}-{case_id(GRID[i])}" for kernel, i in CASES])
def test_kernel_matches_float64_reference_forward_and_backward(kernel, i):
    q, k, v, kw, out_ref, upstream, grads_ref = expected(i)
    fn = attention.get(kernel)
    if kernel not in BACKWARD:
        with torch.no_grad():
            out = fn(q, k, v, **kw)
        torch.testing.assert_close(out.double(), out_ref, atol=1e-5, rtol=1e-5)
        return
    out = fn(q, k, v, **kw)
    torch.testing.assert_close(out.double(), out_ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad((out * upstream.float()).sum(), (q, k, v))
    for name, g, g_ref in zip("qkv", grads, grads_ref):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g.double(), g_ref, atol=1e-5, rtol=1e-5, msg=lambda m: f"grad {name}: {m}")


@pytest.mark.parametrize("cases", [range(len(GRID)), FLEX_CASES], ids=["grid", "flex-subset"])
def test_the_grid_covers_what_it_claims(cases):
    grid = [GRID[i] for i in cases]
    assert {(c["H"] // c["Hkv"]) for c in grid} == {1, 2, 4}
    assert {(c["Tq"], c["Tk"]) for c in grid} == {(5, 5), (3, 7)}
    assert {c["mask"] for c in grid} == {None, "padding", "random"} and {c["window"] for c in grid} == {None, 2}
    assert {c["scale"] for c in grid} == {None, 0.3} and {c["causal"] for c in grid} == {True, False}
    pairs = {(a, b) for a in (True, False) for b in (None, "padding", "random")}
    assert {(c["causal"], c["mask"]) for c in grid} == pairs
    q, k, v, kw, out, *_ = expected(next(i for i, c in enumerate(GRID) if c["mask"] == "random"))
    assert torch.equal(out[0, 0, -1], torch.zeros_like(out[0, 0, -1]))  # the empty row is really there


# bf16: inputs are rounded to bf16 first and the reference uses those same rounded values, so what is
# measured is the kernel's own bf16 arithmetic: scores of size ~3 carry an absolute rounding error of
# ~3 * 2^-9 = 0.006, the weights 2^-9 relative, and the output is rounded to bf16 (2^-9 relative).
# Measured on this CPU over 5 seeds, as |err| / (1 + |ref|): at most 0.0064 forward (manual, einsum,
# heads; sdpa 0.0022, flex 0.0033) and 0.021 for gradients (a squared loss doubles the error and the
# backward pass rounds once more). We allow 2e-2 forward and 5e-2 for gradients: ~3x and ~2.5x headroom.
@pytest.mark.parametrize("kernel", KERNELS)
def test_bf16_matches_the_reference_within_stated_tolerance(kernel):
    q, k, v = make_qkv(H=4, Hkv=2, Tq=5, Tk=7, dtype=torch.bfloat16)
    mask = make_mask("padding", 2, 4, 5, 7)
    out_ref = reference(q, k, v, causal=True, mask=mask, window=4)
    fn = attention.get(kernel)
    with torch.set_grad_enabled(kernel in BACKWARD):
        out = fn(q, k, v, causal=True, mask=mask, window=4)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), out_ref, atol=2e-2, rtol=2e-2)
    if kernel in BACKWARD:
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        grads_ref = torch.autograd.grad(reference(*leaves, causal=True, mask=mask, window=4).square().sum(), leaves)
        for g, g_ref in zip(grads, grads_ref):
            torch.testing.assert_close(g.double(), g_ref.double(), atol=5e-2, rtol=5e-2)


def test_registry_lists_the_builtin_kernels():
    assert attention.available() == ["einsum", "flex", "heads", "manual", "sdpa"]
    with pytest.raises(KeyError, match="unknown attention kernel 'nope'"):
        attention.get("nope")
    assert attention.backends("sdpa") == ("flash", "efficient", "math", "cudnn")
    with pytest.raises(ValueError, match="attention 'manual' has no backend 'flash'"):
        attention.get("manual", "flash")


def test_users_can_register_a_kernel_and_select_it_by_config():
    from gpt import GPT, GPTConfig

    calls = []

    @attention.register("counting")
    def counting(q, k, v, **kw):
        calls.append(q.shape)
        return attention.get("manual")(q, k, v, **kw)

    try:
        with pytest.raises(ValueError, match="already registered"):
            attention.register("counting")(counting)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, attention="counting"))
        model(torch.zeros(1, 8, dtype=torch.long))
        assert len(calls) == 2
        assert attention.spec("counting") == attention.KernelSpec()  # undeclared: the whole contract
    finally:
        registry.unregister("counting")
    assert "counting" not in attention.available()


def test_what_a_kernel_declares_is_what_the_checks_refuse():
    from gpt import GPTConfig
    from gpt.errors import ConfigError

    @attention.register("narrow", trains_on=("cuda",), options=("mask",), why="a test kernel")
    def narrow(q, k, v, **kw):
        return attention.get("manual")(q, k, v, **kw)

    try:
        shape = dict(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, attention="narrow")
        no_window = r"attention=narrow has no sliding window \(a test kernel\), but model.window=4"
        with pytest.raises(ConfigError, match=no_window) as err:
            GPTConfig(**shape, window=4)
        assert err.value.hint == ("set model.window=null, or pick a kernel that has it: "
                                  "attention=sdpa | einsum | flex | heads | manual")
        with pytest.raises(ConfigError, match="has no grouped-query attention .*, but model.n_kv_head=1"):
            GPTConfig(**shape, n_kv_head=1)
        GPTConfig(**shape)  # nothing it lacks is asked for
        no_cpu = r"^attention=narrow cannot train on CPU: it has no backward pass there \(a test kernel\)$"
        with pytest.raises(UserError, match=no_cpu) as err:
            attention.check_trainable("narrow", "cpu")
        assert err.value.hint == ("train with attention=sdpa (narrow can then sample from the checkpoint on CPU), "
                                  "or train on a CUDA GPU")
        no_dropout = "attention=narrow has no dropout on the attention weights .*, but model.dropout=0.1"
        with pytest.raises(ConfigError, match=no_dropout):
            attention.check_trainable("narrow", "cuda", dropout=0.1)
        with pytest.raises(ValueError, match="KernelSpec.options: unknown windows"):
            attention.register("typo", options=("windows",))
    finally:
        registry.unregister("narrow")


def test_causal_and_window_masks_are_bottom_right_aligned():
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert causal_mask(2, 4, window=2).tolist() == [[False, True, True, False], [False, False, True, True]]
    with pytest.raises(ValueError, match="a sliding window is causal"):
        attention.get("manual")(*make_qkv(), causal=False, window=2)


@pytest.mark.parametrize("kernel", BACKWARD)
def test_dropout_only_changes_output_when_asked(kernel):
    q, k, v = make_qkv()
    torch.manual_seed(0)
    a = attention.get(kernel)(q, k, v, dropout_p=0.5)
    b = attention.get(kernel)(q, k, v, dropout_p=0.0)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(b, attention.get("manual")(q, k, v), atol=1e-5, rtol=1e-5)


def test_flex_refuses_dropout_and_cpu_backward_with_clear_messages():
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match="flex has no dropout"):
        attention.get("flex")(q, k, v, dropout_p=0.1)
    with pytest.raises(RuntimeError, match="no backward pass on CPU"):
        attention.get("flex")(q, k, v)


def test_flex_refuses_to_train_on_cpu_at_start_up():
    with pytest.raises(UserError, match="attention=flex cannot train on CPU") as err:
        attention.check_trainable("flex", "cpu")
    assert "attention=sdpa" in err.value.hint
    attention.check_trainable("flex", "cuda")  # a GPU is fine (not present here: nothing runs)
    with pytest.raises(UserError, match="no dropout"):
        attention.check_trainable("flex", "cuda", dropout=0.1)
    for name in BACKWARD:
        attention.check_trainable(name, "cpu", dropout=0.1)


def test_sdpa_backend_pins_torch_backend_or_says_why_not():
    q, k, v = make_qkv(H=4, Hkv=2)
    ref = attention.get("manual")(q, k, v)
    torch.testing.assert_close(attention.get("sdpa", "math")(q, k, v), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(UserError, match="attention.backend=efficient cannot run here \\(cpu, float32\\)"):
        attention.get("sdpa", "efficient")(q, k, v)
    with pytest.raises(UserError, match="cudnn"):
        attention.get("sdpa", "cudnn")(q, k, v)
