"""The gated delta rule (gpt/designs/delta_rule.py): the chunked form (training, prefill) and the recurrent step
(decoding) equal each other in float32 and the float64 token-by-token reference, carry a state across calls, give the
reference's gradients, store and overwrite values under keys as the delta rule says, and equal transformers'
Qwen3-Next gated delta rule where transformers is installed."""

import pytest
import torch

from gpt.designs.delta_rule import check_chunk, chunked, recurrent_step, reference
from gpt.errors import ConfigError

FP32 = dict(atol=1e-5, rtol=0)  # the bound for fp32 against fp32 and against the float64 truth
FP64 = dict(atol=1e-12, rtol=0)


def inputs(B=2, Hk=2, Hv=4, T=21, Dk=8, Dv=12, seed=0, state=False, grad=False):
    """Float64 q, k (B, Hk, T, Dk), v (B, Hv, T, Dv), g = log alpha <= 0 and beta in (0, 1) (B, Hv, T), and an
    initial state (B, Hv, Dk, Dv) or None. q and k are raw (not unit length: the functions normalise them); the
    gates span mild to strong decay (alpha from ~1 down to ~e^-20) as a trained layer's do."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (3 * torch.randn(B, Hk, T, Dk, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, Hv, T, Dv, generator=gen, dtype=torch.float64)
    g = -torch.exp(2 * torch.randn(B, Hv, T, generator=gen, dtype=torch.float64)).clamp(max=20)
    beta = torch.sigmoid(2 * torch.randn(B, Hv, T, generator=gen, dtype=torch.float64))
    S0 = torch.randn(B, Hv, Dk, Dv, generator=gen, dtype=torch.float64) if state else None
    made = [q, k, v, g, beta, S0]
    return [x.requires_grad_() if grad and x is not None else x for x in made]


def stepped(q, k, v, g, beta, state=None):
    """The recurrent step over every token in turn, as decoding runs it: outputs (B, Hv, T, Dv) and the last state."""
    outs = []
    for t in range(q.size(2)):
        out, state = recurrent_step(state, q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t])
        outs.append(out)
    return torch.stack(outs, dim=2), state


def f32(tensors):
    return [None if x is None else x.float() for x in tensors]


CASES = [(chunk, T, dict(Hk=2, Hv=4, Dk=8, Dv=12)) for chunk in (4, 16) for T in (1, chunk - 1, chunk, chunk + 1,
                                                                                   3 * chunk + 5)]
CASES += [(64, T, dict(B=1, Hk=3, Hv=3, Dk=16, Dv=8)) for T in (63, 64, 3 * 64 + 5)]


@pytest.mark.parametrize("chunk, T, shape", CASES, ids=[f"chunk{c}-T{t}-Hk{s['Hk']}" for c, t, s in CASES])
def test_chunked_and_recurrent_agree_in_fp32_and_equal_the_float64_reference(chunk, T, shape):
    x = inputs(T=T, seed=T + chunk, **shape)
    truth, final = reference(*x)
    for name, (out, state) in {"chunked": chunked(*x[:5], chunk=chunk), "stepped": stepped(*x[:5])}.items():
        torch.testing.assert_close(out, truth, **FP64, msg=lambda m: f"{name} float64 output: {m}")
        torch.testing.assert_close(state, final, **FP64, msg=lambda m: f"{name} float64 state: {m}")
    out32, state32 = chunked(*f32(x)[:5], chunk=chunk)
    step32, last32 = stepped(*f32(x)[:5])
    assert out32.dtype == state32.dtype == step32.dtype == torch.float32
    torch.testing.assert_close(out32, step32, **FP32)
    torch.testing.assert_close(state32, last32, **FP32)
    torch.testing.assert_close(out32.double(), truth, **FP32)
    torch.testing.assert_close(step32.double(), truth, **FP32)
    torch.testing.assert_close(state32.double(), final, **FP32)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, FP64), (torch.float32, FP32)])
def test_a_prefill_hands_its_state_on_to_more_chunks_or_to_decoding(dtype, tol):
    q, k, v, g, beta, S0 = (x.to(dtype) for x in inputs(T=37, state=True, seed=5))
    whole, final = chunked(q, k, v, g, beta, chunk=8, initial_state=S0)
    a, b = slice(0, 21), slice(21, 37)  # a split inside a chunk
    first, state = chunked(q[:, :, a], k[:, :, a], v[:, :, a], g[:, :, a], beta[:, :, a], chunk=8, initial_state=S0)
    rest, after = chunked(q[:, :, b], k[:, :, b], v[:, :, b], g[:, :, b], beta[:, :, b], chunk=8, initial_state=state)
    decoded, last = stepped(q[:, :, b], k[:, :, b], v[:, :, b], g[:, :, b], beta[:, :, b], state=state)
    torch.testing.assert_close(torch.cat([first, rest], dim=2), whole, **tol)
    torch.testing.assert_close(torch.cat([first, decoded], dim=2), whole, **tol)
    torch.testing.assert_close(after, final, **tol)
    torch.testing.assert_close(last, final, **tol)
    torch.testing.assert_close(whole.double(), reference(q, k, v, g, beta, S0)[0], **FP32)
    nothing, kept = chunked(q[:, :, :0], k[:, :, :0], v[:, :, :0], g[:, :, :0], beta[:, :, :0], initial_state=S0)
    assert nothing.shape == (2, 4, 0, 12) and torch.equal(kept, S0)


def test_gradients_equal_the_references():
    x = inputs(B=1, Hk=1, Hv=2, T=11, Dk=4, Dv=3, state=True, grad=True, seed=7)
    gen = torch.Generator().manual_seed(8)
    w_out = torch.randn(1, 2, 11, 3, generator=gen, dtype=torch.float64)  # weights on o (B, Hv, T, Dv)
    w_state = torch.randn(1, 2, 4, 3, generator=gen, dtype=torch.float64)  # ... and on the final state

    def grads(out, state):
        return torch.autograd.grad((out * w_out).sum() + (state * w_state).sum(), x)

    truth = grads(*reference(*x))
    assert all(t.abs().max() > 1e-3 for t in truth)  # every input moves the loss: the comparison means something
    for name, got in {"chunked": grads(*chunked(*x[:5], chunk=4, initial_state=x[5])),
                      "stepped": grads(*stepped(*x))}.items():
        for which, a, b in zip("q k v g beta state".split(), got, truth):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=lambda m: f"{name} d/d{which}: {m}")


def test_a_key_holds_the_last_value_written_under_it():
    """beta 1 overwrites (the delta rule: no sum of the two values), an orthogonal key's value is untouched, and
    alpha scales everything stored."""
    e = torch.eye(4, dtype=torch.float64)
    k = torch.stack([e[0], 2 * e[0], e[1], e[0]])[None, None]  # (1, 1, 4, 4): write k0, k0 again, k1; then read k0
    v = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]], dtype=torch.float64)[None, None]
    beta = torch.tensor([[[1.0, 1.0, 1.0, 0.0]]], dtype=torch.float64)  # the last token writes nothing
    g = torch.tensor([[[0.0, 0.0, 0.0, -0.5]]], dtype=torch.float64)  # ... and decays the state by alpha = e^-1/2
    q = k.clone()  # each token reads under its own key; scale 1
    held = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [3.0, 4.0]], dtype=torch.float64)
    held[3] *= torch.exp(torch.tensor(-0.5, dtype=torch.float64))
    outs = {"reference": reference(q, k, v, g, beta, scale=1.0)[0],
            "chunked": chunked(q, k, v, g, beta, chunk=2, scale=1.0)[0],
            "stepped": stepped(q, k, v, g, beta)[0] * 2}  # the step's default scale, Dk^-1/2 = 1/2
    for name, out in outs.items():  # rtol 1e-5: l2norm's eps leaves unit vectors 5e-7 short of unit length
        torch.testing.assert_close(out[0, 0], held, atol=0, rtol=1e-5, msg=lambda m: f"{name}: {m}")


def test_half_precision_inputs_are_computed_in_float32():
    x = [None if t is None else t.bfloat16() for t in inputs(T=9, state=True)]
    out, state = chunked(*x[:5], chunk=4, initial_state=x[5])
    step, last = stepped(*x)
    assert out.dtype == step.dtype == torch.bfloat16 and state.dtype == last.dtype == torch.float32
    torch.testing.assert_close(state, chunked(*f32(x)[:5], chunk=4, initial_state=x[5].float())[1], **FP32)
    torch.testing.assert_close(out, step, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("chunk", [0, -64, 48, 64.0, True, "64", None])
def test_a_chunk_size_the_chunking_cannot_use_is_refused_by_name(chunk):
    x = inputs(T=5)
    with pytest.raises(ConfigError, match=rf"^chunk must be a positive power of two .*got {chunk!r}$"):
        chunked(*x[:5], chunk=chunk)
    with pytest.raises(ConfigError, match="model.design_options.deltanet.chunk must be") as caught:
        check_chunk(chunk, "model.design_options.deltanet.chunk")
    assert caught.value.hint == "model.design_options.deltanet.chunk=64"


def test_shapes_that_disagree_are_refused():
    q, k, v, g, beta, _ = inputs(Hk=3, Hv=4)
    with pytest.raises(ValueError, match=r"v's heads \(4\) must be a multiple of q's \(3\)"):
        chunked(q, k, v, g, beta)
    with pytest.raises(ValueError, match="must be one"):
        chunked(q, k[..., :4], v, g, beta)


def test_equals_transformers_qwen3_next_gated_delta_rule():
    """The outside oracle: transformers' pure-torch Qwen3-Next functions, in their layout (B, T, H, D), with their
    in-kernel L2 norm on and their query scale Dk^-1/2 (ours by default); GQA Hk=2 -> Hv=4 as theirs repeats."""
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next",
                               reason="transformers with Qwen3-Next is not installed: no outside oracle")
    theirs = {name: getattr(getattr(qwen, name), "__wrapped__", getattr(qwen, name))  # the torch code, never a hub
              for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")}  # kernel
    q, k, v, g, beta, S0 = f32(inputs(T=37, state=True, seed=11))
    ours, final = chunked(q, k, v, g, beta, chunk=16, initial_state=S0)
    assert torch.allclose(ours.double(), reference(q, k, v, g, beta, S0)[0], **FP32)
    flip = [x.transpose(1, 2) for x in (q, k, v, g, beta)]  # (B, H, T, ...) -> (B, T, H, ...)
    for name, extra in (("torch_chunk_gated_delta_rule", {"chunk_size": 16}), ("torch_recurrent_gated_delta_rule", {})):
        out, state = theirs[name](*flip, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                  **extra)
        torch.testing.assert_close(out.transpose(1, 2), ours, **FP32, msg=lambda m: f"{name} output: {m}")
        torch.testing.assert_close(state, final, **FP32, msg=lambda m: f"{name} state: {m}")
