"""Which SDPA backend attention=sdpa uses (gpt.kernels.backends): the rule for each device, dtype and phase, the
kernel applying it in eager mode, and a pinned backend reaching a compiled training graph from outside it, without
splitting the graph (issue 30: the pin inside the graph halved compiled training speed on a GPU)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import make_boxed_func
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

from gpt import GPT, GPTConfig
from gpt.kernels import get
from gpt.kernels.backends import Pin, choose, compute_dtype, pin_for
from gpt.train.build import forward_context

FLASH, EFFICIENT, MATH, CUDNN = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
                                 SDPBackend.CUDNN_ATTENTION)
CPU_FUSED = "aten._scaled_dot_product_flash_attention_for_cpu"  # what torch runs on a CPU when it may choose
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, attention="sdpa")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t_q, t_k", [(16, 16), (1, 17), (4, 20)], ids=["training", "decode", "chunk"])
def test_a_pinned_backend_is_used_for_every_shape_dtype_and_phase(device, dtype, t_q, t_k):
    for name, backend in (("flash", FLASH), ("efficient", EFFICIENT), ("math", MATH), ("cudnn", CUDNN)):
        assert choose(name, device, dtype, t_q, t_k) == (backend,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_left_to_torch_only_a_cuda_decode_step_is_limited_to_fused_kernels_never_cudnn(dtype):
    half = dtype != torch.float32
    for device in ("cpu", "mps"):
        assert choose(None, device, dtype, 16, 16) is None
        assert choose(None, device, dtype, 1, 17) is None
    assert choose(None, "cuda", dtype, 16, 16) is None  # training and full forwards: torch's choice
    decode = choose(None, "cuda", dtype, 1, 17)  # a cached step: the key length grows every call
    assert decode == ((FLASH, EFFICIENT, MATH) if half else (EFFICIENT, MATH))  # flash takes half precision only
    assert choose(None, "cuda", dtype, 4, 20) == decode  # any queries against a longer cache
    assert pin_for("sdpa", None, torch.device("cuda"), dtype, decoding=True).allowed == decode
    assert pin_for("sdpa", None, torch.device("cuda"), dtype).allowed is None
    assert pin_for("flex", "flash", torch.device("cuda"), dtype).allowed is None  # only sdpa has backends
    with pytest.raises(ValueError, match="unknown sdpa backend 'fast'"):
        choose("fast", "cuda", dtype, 1, 2)


def test_compute_dtype_is_autocasts_where_it_is_on():
    assert compute_dtype(torch.device("cpu"), torch.float32) == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compute_dtype(torch.device("cpu"), torch.float32) == torch.bfloat16


class OpNames(TorchDispatchMode):
    """Records the name of every aten op that runs."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket).replace("aten::", "aten."))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend, fused", [(None, True), ("flash", True), ("math", False)])
def test_the_eager_kernel_runs_the_chosen_backend(backend, fused):
    q, k, v = torch.randn(3, 1, 2, 8, 16).unbind(0)
    with OpNames() as ops:
        get("sdpa", backend)(q, k, v, causal=True)
    assert (CPU_FUSED in ops.names) == fused, ops.names


def compile_and_step(model: torch.nn.Module, context) -> tuple[list, list]:
    """One compiled forward + backward under ``context``, traced by AOTAutograd into plain graphs (no Inductor):
    the graphs Dynamo captured and the aten ops of the forward graph."""
    dynamo_graphs, forward_ops = [], []

    def forward_compiler(graph, inputs):
        forward_ops.extend(str(n.target) for n in graph.graph.nodes if n.op == "call_function")
        return make_boxed_func(graph)

    aot = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda graph, inputs: make_boxed_func(graph))

    def record(graph, inputs):
        dynamo_graphs.append(graph)
        return aot(graph, inputs)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend=record)
    x = torch.randint(0, 64, (2, 16))
    with context:
        _, loss = compiled(x, x)
    loss.backward()
    return dynamo_graphs, forward_ops


@pytest.mark.parametrize("backend, fused", [(None, True), ("math", False)])
def test_a_pinned_backend_reaches_the_compiled_graph_from_outside_and_keeps_it_whole(backend, fused):
    torch.manual_seed(0)
    config = GPTConfig(**TINY, attention_backend=backend)
    graphs, ops = compile_and_step(GPT(config), forward_context(config, torch.device("cpu"), "fp32"))
    assert len(graphs) == 1 and not counters["graph_break"], dict(counters["graph_break"])  # one graph, no break
    inside = [str(n.target) for g in graphs for n in g.graph.nodes]
    assert not any("sdpa_kernel" in t for t in inside), "a backend context inside the compiled region"
    assert any("scaled_dot_product" in t or "_softmax" in t for t in ops), ops
    assert any(CPU_FUSED.split(".")[1] in t for t in ops) == fused, ops  # the pin chose the kernel


def test_a_pin_is_reusable_and_restores_what_was_allowed():
    pin = Pin((MATH,))
    for _ in range(2):
        with pin:
            assert not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
    with Pin(None):
        assert torch.backends.cuda.flash_sdp_enabled()


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_one_masked_query_per_row_on_a_cpu_equals_torchs_fused_kernel(kv_heads, dtype):
    """A decode step over rows of different lengths (the serving engine's) takes two matmuls instead of torch's
    fused CPU kernel: the same outputs, a row whose keys are all masked gets zeros, a pinned backend still runs."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, 4, 1, 8, generator=g).to(dtype)
    k, v = (torch.randn(5, kv_heads, 11, 8, generator=g).to(dtype) for _ in range(2))
    mask = torch.arange(11)[None, :] >= torch.tensor([0, 3, 10, 6, 11])[:, None]  # the last row: no key
    sdpa = get("sdpa")
    out = sdpa(q, k, v, mask=mask[:, None, None, :], scale=0.3)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    want = torch.nn.functional.scaled_dot_product_attention(
        q[:4].to(wide), k[:4].to(wide), v[:4].to(wide), attn_mask=mask[:4, None, None, :], scale=0.3,
        enable_gqa=kv_heads != 4)
    atol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]  # float64 stays float64
    torch.testing.assert_close(out[:4].to(wide), want, atol=atol, rtol=0)
    assert out[4].abs().sum() == 0
    torch.testing.assert_close(sdpa(q, k, v, mask=mask[:, None, None, :], scale=0.3, backend="math"), out,
                               atol=atol, rtol=0)
