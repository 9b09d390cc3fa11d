"""The serving engine (gpt.serve.engine) and its cache pool, without HTTP: each sequence's tokens are those
gpt.inference.decoding.stream gives it alone (scripts/generate.py's loop) for its seed and settings, whatever else is
decoded beside it: prompts of mixed lengths, sequences joining mid-stream, contexts sliding past block_size, every
built-in design's cache kind (each case its contract tests check), and a user's cache kind the pool does not know."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from gpt.designs import active, available, get
from gpt.inference import weight_layout
from gpt.inference.decoding import decode_step, prefill, stream
from gpt.inference.weight_layout import onednn_available
from gpt.model import GPT, GPTConfig
from gpt.model.kv_cache import KVCache, LayerKV
from gpt.serve.cache_pool import SlotPool, SoloPool
from gpt.serve.engine import Engine, Sampling, Sequence
from gpt.serve.speculate import keep, verify
from gpt.tokenizers.tokenizer import CharTokenizer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 ():.,=+-*\n")
BASE = dict(n_layer=2, n_head=4, n_embd=32, block_size=24, vocab_size=len(CHARS) + 3)  # padded past the tokenizer's

CASES = {"gpt2": {}, "window": {"window": 6}, "gqa": {"n_kv_head": 2}} | {
    f"{name}:{case}": settings | ({"attention": "manual"} if {"softcap", "sink"} & set(settings.get("designs", []))
                                 else {})
    for name in available() for case, settings in get(name).cases.items()}  # a kernel that forms the scores
CASES |= {  # per-layer layouts (docs/layouts.md): a window ring beside a global layer, two RoPE bases; NoPE; DeltaNet
    "layout:local-global": {"layers": "SL", "layer_kinds": {"S": {"window": 6, "designs": ["rope"]},
                                                            "L": {"designs": ["rope"],
                                                                  "options": {"rope": {"base": 1000000}}}}},
    "layout:nope": {"layers": "RN", "layer_kinds": {"R": {"designs": ["rope"]}, "N": {}}},
    "layout:deltanet-gated": {"layers": "DG", "norm": "rmsnorm",
                              "layer_kinds": {"D": {"designs": ["deltanet"]}, "G": {"designs": ["gated"]}}},
}

JOBS = [  # (prompt length, max_tokens, sampling settings): greedy, top-k, top-p; two run past block_size (slide)
    (5, 30, dict(temperature=0.0)), (1, 9, dict(temperature=0.9, top_k=5, seed=3)),
    (17, 12, dict(temperature=1.1, top_p=0.8, seed=-2)), (2, 40, dict(temperature=0.7, seed=11)),
    (9, 6, dict(temperature=0.0)), (24, 10, dict(temperature=1.0, top_k=7, seed=5)),
]


def model_for(settings: dict, seed: int = 0) -> GPT:
    """A random model with weights 6x GPT-2's initial ones: peaked attention and logits, so a key or value the
    cache got wrong changes the tokens (at GPT-2's scale a random model's attention is nearly uniform)."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**BASE | settings)).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.mul_(6.0)
    return model


def alone(model: GPT, prompt: list[int], max_tokens: int, settings: dict) -> list[int]:
    """What generate.py's loop samples for this prompt alone (its own generator, vocabulary limited)."""
    generator = torch.Generator().manual_seed(settings.get("seed", 0))
    temperature = settings["temperature"]
    return [int(t) for t in stream(model, [prompt], max_tokens, temperature=temperature, top_k=settings.get("top_k"),
                                   top_p=settings.get("top_p"), generator=generator, vocab_limit=len(CHARS))]


def prompts(seed: int) -> list[list[int]]:
    """Random prompts of JOBS' lengths; the last one starts with the third's first 16 tokens (a prefix cache hit)."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, len(CHARS), (n,), generator=g).tolist() for n, _, _ in JOBS]
    rows[5][:16] = rows[2][:16]
    return rows


def serve(engine: Engine, prompts: list[list[int]], tokenizer) -> list[list[int]]:
    """Submit the first half of JOBS, the rest once the first sequence has its third token (a join mid-stream);
    each sequence's tokens."""
    got: list[list[int]] = [[] for _ in JOBS]
    done = [threading.Event() for _ in JOBS]
    third = threading.Event()

    def deliver(i: int):
        def put(output) -> None:
            assert output.error is None, output.error
            if output.token is not None:
                got[i].append(output.token)
            if len(got[0]) >= 3:
                third.set()
            if output.finish_reason is not None:
                done[i].set()
        return put

    sequences = [Sequence(p, Sampling(max_tokens=n, **s), tokenizer, deliver(i))
                 for i, (p, (_, n, s)) in enumerate(zip(prompts, JOBS))]
    engine.submit(sequences[:3])
    assert third.wait(60)
    engine.submit(sequences[3:])
    assert all(event.wait(60) for event in done)
    return got


ENGINES = {"plain": {}, "prefix+chunks": dict(prefix_blocks=16, prefill_chunk=5)}


@pytest.mark.parametrize("engine_settings", list(ENGINES))
@pytest.mark.parametrize("case", list(CASES))
def test_each_sequence_gets_what_it_gets_alone_whatever_is_beside_it(case, engine_settings):
    """Plain, and with the prefix cache (the last prompt hits) and prompts prefilled 5 tokens a step between
    decode steps, where the design's cache allows them."""
    settings = CASES[case]
    model, tokenizer = model_for(settings), CharTokenizer(CHARS)
    engine = Engine(model, tokenizer, max_batch=4, max_queue=8, **ENGINES[engine_settings]).start()
    try:
        # a built-in design's cache kind is pooled; a layout's kinds keep slots of their own: one cache per sequence
        assert isinstance(engine.pool, SoloPool if case.startswith("layout:") else SlotPool)
        rows = prompts(len(case))
        got = serve(engine, rows, tokenizer)
        for i, (prompt, (_, n, s)) in enumerate(zip(rows, JOBS)):
            assert got[i] == alone(model, prompt, n, s), (case, i)
        assert engine.pool.rows == [] and engine.pool.free == 4  # every slot given back
        assert engine.steps < sum(n for _, n, _ in JOBS)  # decoded together
    finally:
        engine.stop()


@pytest.mark.parametrize("case", [case for case in CASES if not case.startswith("layout:")])  # pooled kinds
def test_the_pools_logits_are_each_rows_own_caches_logits(case):
    """Teacher-forced: rows join the pool at different steps with contexts of different lengths (1 token, a ring
    wrapped, block_size) and one leaves; each row's logits at every step are those of its own one-row KVCache."""
    model = model_for(CASES[case], 2)
    pool = SlotPool(model, 3, torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    streams = {name: torch.randint(0, len(CHARS), (40,), generator=g).tolist() for name in "abcd"}
    joins = {0: ("a", 1), 2: ("b", 9), 3: ("c", 2), 5: ("d", BASE["block_size"] - 4)}  # step: (row, prompt length)
    own: dict[str, tuple] = {}  # row -> (its own cache, tokens fed so far)
    for step in range(8):
        if pool.rows:
            logits = pool.decode(model)
            for i, name in enumerate(pool.rows):
                cache, fed = own[name]
                alone_logits = decode_step(model, torch.tensor([[streams[name][fed]]]), torch.tensor([[fed]]), cache)
                torch.testing.assert_close(logits[i : i + 1], alone_logits, atol=1e-4, rtol=1e-4, msg=(case, name))
                own[name] = (cache, fed + 1)
            pool.feed([streams[name][own[name][1]] for name in pool.rows])
        if step == 4:
            pool.release(pool.rows.index("b"))  # leaves: "c" moves into its slot
        if step in joins:
            name, n = joins[step]
            mine, theirs = KVCache(model.config, 1, "cpu"), KVCache(model.config, 1, "cpu")
            for cache in (mine, theirs):
                prefill(model, torch.tensor([streams[name][:n]]), torch.arange(n)[None], None, cache)
            pool.insert(name, theirs, n, streams[name][n])
            own[name] = (mine, n)
    assert pool.free == 0 and sorted(pool.rows) == ["a", "c", "d"]


@pytest.mark.parametrize("settings", [{}, {"n_kv_head": 2}, {"norm": "rmsnorm", "bias": False, "mlp": False},
                                      {"dtype": torch.bfloat16}], ids=["gpt2", "gqa", "rmsnorm, no mlp", "bf16"])
def test_gpt2_layers_step_the_pool_as_straight_calls_with_the_general_steps_logits_bit_for_bit(settings, monkeypatch):
    """GPT-2's layers decode the pool through PlainStep (half the general step's time): the same logits and the same
    stores bit for bit as the general step through the pool's view, rows of one length (no mask), then of several
    (masked) as rows join and one leaves."""
    dtype = settings.pop("dtype", torch.float32)
    model = model_for(settings, 4).to(dtype)
    weight_layout.gemv_layout(model)  # as the server stores the weights
    pools = [SlotPool(model, 3, torch.device("cpu")) for _ in range(2)]
    assert pools[0].straight(model) is not None
    monkeypatch.setattr(pools[1], "straight", lambda model: None)  # the general step through _View
    g = torch.Generator().manual_seed(5)
    streams = {name: torch.randint(0, len(CHARS), (40,), generator=g).tolist() for name in "abcd"}
    joins = {0: ("a", 3), 1: ("b", 3), 3: ("c", 7), 6: ("d", 2)}
    fed = {}
    for step in range(10):
        if pools[0].rows:
            fast, general = (pool.decode(model) for pool in pools)
            assert torch.equal(fast, general), step
            for name in pools[0].rows:
                fed[name] += 1
            for pool in pools:
                pool.feed([streams[name][fed[name]] for name in pool.rows])
        if step == 5:
            for pool in pools:
                pool.release(pool.rows.index("a"))
        if step in joins:
            name, n = joins[step]
            for pool in pools:
                cache = KVCache(model.config, 1, "cpu")
                prefill(model, torch.tensor([streams[name][:n]]), torch.arange(n)[None], None, cache)
                pool.insert(name, cache, n, streams[name][n])
            fed[name] = n
    assert pools[0].held == pools[1].held and torch.equal(pools[0].key_mask, pools[1].key_mask)
    for a, b in zip(*(pool.stores for pool in pools)):
        assert torch.equal(a["k"][0], b["k"][0]) and torch.equal(a["v"][0], b["v"][0])
    hooked = model_for(settings, 4)
    hooked.transformer.h[0].attn.hook_q.add(lambda q, hook: q)  # an interpretability hook: the general step's
    assert SlotPool(hooked, 1, torch.device("cpu")).straight(hooked) is None


@pytest.mark.parametrize("case", ["gpt2", "mla:alone", "alibi:alone", "rope:alone"])
def test_rows_whose_columns_wrap_round_are_moved_so_a_step_reads_only_their_columns(case):
    """A prompt longer than the pool's column joins a short row: its columns wrap round the ring, and the step would
    read every column (all 1,024 of GPT-2's, per layer); the step moves the rows' columns first, reads only them, and
    each row's logits are still its own cache's."""
    model = model_for(CASES[case], 5)
    pool, size = SlotPool(model, 2, torch.device("cpu")), BASE["block_size"]
    g = torch.Generator().manual_seed(1)
    own = {}
    for name, n in (("a", 2), ("b", 9)):
        tokens = torch.randint(0, len(CHARS), (n + 1,), generator=g).tolist()
        mine, theirs = KVCache(model.config, 1, "cpu"), KVCache(model.config, 1, "cpu")
        for cache in (mine, theirs):
            prefill(model, torch.tensor([tokens[:n]]), torch.arange(n)[None], None, cache)
        pool.insert(name, theirs, n, tokens[n])
        own[name] = (mine, n, tokens[n])
    assert pool.span() == (0, size, False)  # "b" holds columns 17..23 and 0..1: every column would be read
    logits = pool.decode(model)
    assert pool.column == size // 2 + 1 and pool.span() == (size // 2 - 9, size // 2 + 2, False)  # now 11 of 24
    for i, name in enumerate(pool.rows):
        cache, fed, token = own[name]
        alone_logits = decode_step(model, torch.tensor([[token]]), torch.tensor([[fed]]), cache)
        torch.testing.assert_close(logits[i : i + 1], alone_logits, atol=1e-4, rtol=1e-4, msg=(case, name))


class _OwnKV(LayerKV):
    """A user's cache kind (the pool cannot know where its slots are)."""


def test_a_cache_kind_the_pool_does_not_know_decodes_each_sequence_in_its_own_cache(monkeypatch):
    model, tokenizer = model_for({"designs": ["rope"]}, 1), CharTokenizer(CHARS)
    rope = next(d for d in active(model.config) if d.name == "rope")
    monkeypatch.setattr(type(rope), "cache", _OwnKV)
    engine = Engine(model, tokenizer, max_batch=3, max_queue=8).start()
    try:
        assert isinstance(engine.pool, SoloPool)
        rows = prompts(7)
        got = serve(engine, rows, tokenizer)
        for i, (prompt, (_, n, s)) in enumerate(zip(rows, JOBS)):
            assert got[i] == alone(model, prompt, n, s), i
    finally:
        engine.stop()


def run_one(engine: Engine, prompt: list[int], tokenizer, max_tokens: int, **settings) -> list[int]:
    """One sequence through the engine, alone; its tokens."""
    got, done = [], threading.Event()

    def deliver(output) -> None:
        assert output.error is None, output.error
        got.extend([output.token] if output.token is not None else [])
        if output.finish_reason is not None:
            done.set()

    engine.submit([Sequence(prompt, Sampling(max_tokens=max_tokens, **settings), tokenizer, deliver)])
    assert done.wait(60)
    return got


@pytest.mark.parametrize("case", ["gpt2", "mla:alone", "rope:alone"])
def test_a_multi_turn_chat_reuses_its_earlier_turns_from_the_prefix_cache(case):
    """Each turn's prompt is the last turn's prompt, its answer and a new message: at least 80% of the prompt tokens
    of a four-turn replay come from the prefix cache (the answers' blocks too), and every turn's tokens are still
    those of generate.py's loop alone."""
    model, tokenizer = model_for(CASES[case] | {"block_size": 160}, 4), CharTokenizer(CHARS)
    engine = Engine(model, tokenizer, max_batch=2, max_queue=4, prefix_blocks=64).start()
    try:
        g = torch.Generator().manual_seed(5)
        prompt = torch.randint(0, len(CHARS), (40,), generator=g).tolist()  # a system prompt and a first message
        looked = 0
        for turn in range(4):
            settings = dict(temperature=0.8, top_k=6, seed=turn)
            answer = run_one(engine, prompt, tokenizer, 20, **settings)
            assert answer == alone(model, prompt, 20, settings), (case, turn)
            looked += len(prompt)
            prompt = prompt + answer + torch.randint(0, len(CHARS), (6,), generator=g).tolist()
        first_turn = 40
        assert engine.prefix.reused >= 0.8 * (looked - first_turn), (engine.prefix.reused, looked)
        assert engine.prefix.hit_rate == engine.prefix.reused / looked
    finally:
        engine.stop()


def run_together(engine: Engine, prompts: list[list[int]], tokenizer, max_tokens: int,
                 settings: list[dict]) -> list[list[int]]:
    """Sequences submitted at once (one request's worth: the engine admits them in the same step); their tokens."""
    got: list[list[int]] = [[] for _ in prompts]
    done = [threading.Event() for _ in prompts]

    def deliver(i: int):
        def put(output) -> None:
            got[i].extend([output.token] if output.token is not None and output.error is None else [])
            if output.finish_reason is not None:
                done[i].set()
        return put

    engine.submit([Sequence(p, Sampling(max_tokens=max_tokens, **s), tokenizer, deliver(i))
                   for i, (p, s) in enumerate(zip(prompts, settings))])
    assert all(event.wait(60) for event in done)
    return got


@pytest.mark.parametrize("chunk", [0, 8])
@pytest.mark.parametrize("case", ["gpt2", "mla:alone"])
def test_prompts_sharing_a_prefix_that_arrive_together_compute_it_once(case, chunk):
    """Three prompts that start with the same 32 tokens (two blocks), submitted together: the first computes them
    (whole, or in chunks of 8 over four steps), the others wait for its blocks and find them in the prefix cache;
    each gets generate.py's tokens alone (greedy, and sampled with a seed)."""
    model, tokenizer = model_for(CASES[case] | {"block_size": 64}, 7), CharTokenizer(CHARS)
    engine = Engine(model, tokenizer, max_batch=4, max_queue=4, prefix_blocks=16, prefill_chunk=chunk).start()
    try:
        g = torch.Generator().manual_seed(8)
        shared = torch.randint(0, len(CHARS), (32,), generator=g).tolist()
        rows = [shared + torch.randint(0, len(CHARS), (5,), generator=g).tolist() for _ in range(3)]
        settings = [dict(temperature=0.0), dict(temperature=0.9, top_k=5, seed=2), dict(temperature=1.0, seed=3)]
        got = run_together(engine, rows, tokenizer, 10, settings)
        for i, (prompt, s) in enumerate(zip(rows, settings)):
            assert got[i] == alone(model, prompt, 10, s), (case, chunk, i)
        assert engine.prefix.reused == 2 * 32 and engine.prefix.looked == 3 * 37  # the second and third hit
    finally:
        engine.stop()


@pytest.mark.parametrize("case", ["gpt2", "mla:alone"])
def test_a_chat_replay_of_conversations_arriving_together_reuses_every_token_the_model_computed(case):
    """scripts/bench_serve.py's chat replay in the engine, its shapes and turns arriving together: four
    conversations, one 64-token system prompt, a 4-token first message, then each turn the last prompt, its
    12-token answer and a 4-token message. Every prompt token the model computed before is found (the ceiling):
    a first turn's system prompt (all but the first conversation's, whose prefill the others wait for), a later
    turn's last prompt and its answer but the last token, never fed: 1,332 of 1,472 prompt tokens (90%). Whole
    blocks of 16 alone would give 1,152 (78%), and 960 (65%) where every first turn computes the system prompt."""
    model, tokenizer = model_for(CASES[case] | {"block_size": 128}, 3), CharTokenizer(CHARS)
    engine = Engine(model, tokenizer, max_batch=8, max_queue=8, prefix_blocks=256).start()
    try:
        g = torch.Generator().manual_seed(6)
        words = lambda n: torch.randint(0, len(CHARS), (n,), generator=g).tolist()  # noqa: E731
        system = words(64)
        chats = [system + words(4) for _ in range(4)]
        ceiling = 0
        for turn in range(4):
            settings = [dict(temperature=0.8, top_k=6, seed=4 * c + turn) for c in range(4)]
            answers = run_together(engine, chats, tokenizer, 12, settings)
            for c, (prompt, answer) in enumerate(zip(chats, answers)):
                assert answer == alone(model, prompt, 12, settings[c]), (case, turn, c)
                ceiling += len(prompt) - 4 - 1 if turn else 64 * (c > 0)  # all but the new message and the
                # answer's last token; a first turn, the system prompt
            chats = [prompt + answer + words(4) for prompt, answer in zip(chats, answers)]
        assert engine.prefix.looked == 4 * (68 + 84 + 100 + 116)
        assert engine.prefix.reused == ceiling == 1332, (engine.prefix.reused, ceiling)
        assert engine.prefix.hit_rate >= 0.8
    finally:
        engine.stop()


def test_a_long_prompt_is_prefilled_in_chunks_between_the_other_streams_steps():
    model, tokenizer = model_for({"block_size": 64}, 6), CharTokenizer(CHARS)
    engine = Engine(model, tokenizer, max_batch=2, max_queue=4, prefill_chunk=8).start()
    order: list[str] = []  # which sequence each delivered token belongs to, in order
    done = {name: threading.Event() for name in "ab"}
    got: dict[str, list[int]] = {"a": [], "b": []}

    def deliver(name: str):
        def put(output) -> None:
            order.append(name)
            got[name].extend([output.token] if output.token is not None else [])
            if output.finish_reason is not None:
                done[name].set()
        return put

    a, b = list(range(3)), [i % len(CHARS) for i in range(7, 55)]  # b: 48 tokens, 6 chunks of 8
    try:
        engine.submit([Sequence(a, Sampling(max_tokens=30, temperature=0.0), tokenizer, deliver("a"))])
        while len(order) < 3:
            threading.Event().wait(0.01)
        engine.submit([Sequence(b, Sampling(max_tokens=5, temperature=0.0), tokenizer, deliver("b"))])
        assert done["a"].wait(60) and done["b"].wait(60)
        first_b = order.index("b")
        assert order[3:first_b].count("a") >= 5  # a kept decoding while b's chunks were prefilled
        assert got["a"] == alone(model, a, 30, {"temperature": 0.0})
        assert got["b"] == alone(model, b, 5, {"temperature": 0.0})
    finally:
        engine.stop()


def test_the_prefix_cache_evicts_the_least_recently_used_blocks_and_is_off_for_rings():
    model, tokenizer = model_for({"block_size": 64}, 5), CharTokenizer(CHARS)
    engine = Engine(model, tokenizer, max_batch=2, max_queue=4, prefix_blocks=4).start()
    try:
        a, b = list(range(20)) + list(range(20)), list(range(5, 45))  # 40 tokens: two whole blocks before the last
        run_one(engine, a, tokenizer, 1, temperature=0.0)  # two whole blocks, and 8 tokens once it finished
        run_one(engine, b, tokenizer, 1, temperature=0.0)  # b's second block and its last 8 take a's first two's place
        assert len(engine.prefix.blocks) == 4 and engine.prefix.reused == 0
        run_one(engine, b, tokenizer, 1, temperature=0.0)
        assert engine.prefix.reused == 32  # both of b's whole blocks (its last 8 tokens are more than it leaves)
        run_one(engine, a, tokenizer, 1, temperature=0.0)
        assert engine.prefix.reused == 32  # a's last 8 tokens are useless without its first two blocks, evicted
    finally:
        engine.stop()
    assert Engine(model_for({"window": 6}), tokenizer, prefix_blocks=8).prefix is None  # a ring cannot continue
    assert Engine(model_for(CASES["linear:alone"]), tokenizer, prefix_blocks=8).prefix is None  # nor a state


@pytest.mark.parametrize("case", ["gpt2", "mla:alone", "alibi:alone"])
def test_prompt_lookup_speculation_keeps_greedy_tokens_in_fewer_model_calls(case):
    """A greedy sequence alone on repetitive text: the tokens of the loop alone, fewer model calls than tokens, the
    guesses counted; a sampled one is not speculated."""
    model, tokenizer = model_for(CASES[case] | {"block_size": 96}, 7), CharTokenizer(CHARS)
    engine = Engine(model, tokenizer, max_batch=2, max_queue=4, speculate=4).start()
    try:
        prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 4
        steps = engine.steps
        got = run_one(engine, prompt, tokenizer, 50, temperature=0.0)
        assert got == alone(model, prompt, 50, {"temperature": 0.0})
        assert engine.accepted > 0 and engine.drafted >= engine.accepted
        assert engine.steps - steps < 50  # one prefill, then fewer verify steps than tokens
        assert engine.metrics()["acceptance_rate"] == engine.accepted / engine.drafted
        drafted = engine.drafted
        assert run_one(engine, prompt, tokenizer, 20, temperature=0.9, seed=2) == \
            alone(model, prompt, 20, {"temperature": 0.9, "seed": 2})
        assert engine.drafted == drafted
    finally:
        engine.stop()
    assert Engine(model_for({"window": 6}), tokenizer, speculate=4).speculate == 0  # a ring cannot take guesses


def test_rejected_guesses_are_never_read_again():
    """verify's logits after the fed token are a one-token step's; after keep, the rejected guesses' columns are
    masked, so a row joining whose columns wrap round (the step then reads every column) changes nothing."""
    model = model_for({"block_size": 96}, 8)
    pool = SlotPool(model, 2, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randint(0, len(CHARS), (n,), generator=g).tolist() for n in (20, 70))
    mine, theirs = KVCache(model.config, 1, "cpu"), KVCache(model.config, 1, "cpu")
    for cache in (mine, theirs):
        prefill(model, torch.tensor([a[:-1]]), torch.arange(19)[None], None, cache)
    pool.insert("a", theirs, 19, a[-1])
    logits = verify(model, pool, [1, 2, 3])  # three guesses, all rejected
    own = decode_step(model, torch.tensor([[a[-1]]]), torch.tensor([[19]]), mine)
    torch.testing.assert_close(logits[:1], own, atol=1e-4, rtol=1e-4)
    keep(pool, 4, 1)
    pool.feed([5])
    other = KVCache(model.config, 1, "cpu")
    prefill(model, torch.tensor([b]), torch.arange(70)[None], None, other)
    pool.insert("b", other, 70, 6)  # 70 tokens before column 20: they wrap round
    assert pool.span() == (0, 96, False)
    logits = pool.decode(model)
    own = decode_step(model, torch.tensor([[5]]), torch.tensor([[20]]), mine)
    torch.testing.assert_close(logits[:1], own, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", [case for case in CASES if not case.startswith("layout:")])  # pooled kinds
def test_sequences_joining_together_are_prefilled_in_one_call_and_each_gets_what_it_gets_alone(case, monkeypatch):
    """Prompts of different lengths joining in the same step go through one batched prefill (sink tokens' stores:
    those of one length), written straight into their slots once the stores exist (an emptied pool) or copied in
    from a cache of the prompts' width (the first prefill; slots whose columns wrap round; a ring shorter than the
    prompts); each sequence's tokens are still those of generate.py's loop alone."""
    model, tokenizer = model_for(CASES[case], 9), CharTokenizer(CHARS)
    engine = Engine(model, tokenizer, max_batch=len(JOBS), max_queue=8)
    batches, aimed = [], []
    prefill, aim = engine.pool.prefill, engine.pool._aim
    monkeypatch.setattr(engine.pool, "prefill", lambda m, contexts, seqs: batches.append(
        sorted(map(len, contexts))) or prefill(m, contexts, seqs))
    monkeypatch.setattr(engine.pool, "_aim", lambda *args: aimed.append(args[1:]) or aim(*args))
    engine.start()
    try:
        for round_ in range(2):  # the second round finds the stores allocated and the pool empty
            rows = prompts(len(case) + round_)
            got = serve_together(engine, rows, tokenizer)
            for i, (prompt, (_, n, s)) in enumerate(zip(rows, JOBS)):
                assert got[i] == alone(model, prompt, n, s), (case, round_, i)
        first = sorted(n for n, _, _ in JOBS)
        if engine.pool.paddable:
            assert batches[0] == first  # the six prompts in one call
            assert bool(aimed) == (max(first) <= engine.pool.size)  # the second round's went straight into the
            # slots, unless the prompts are longer than a ring
        else:
            assert all(len(set(batch)) == 1 for batch in batches)
    finally:
        engine.stop()


def serve_together(engine: Engine, prompts: list[list[int]], tokenizer) -> list[list[int]]:
    """Submit every one of JOBS at once; each sequence's tokens."""
    got: list[list[int]] = [[] for _ in JOBS]
    done = [threading.Event() for _ in JOBS]

    def deliver(i: int):
        def put(output) -> None:
            assert output.error is None, output.error
            got[i].extend([output.token] if output.token is not None else [])
            if output.finish_reason is not None:
                done[i].set()
        return put

    engine.submit([Sequence(p, Sampling(max_tokens=n, **s), tokenizer, deliver(i))
                   for i, (p, (_, n, s)) in enumerate(zip(prompts, JOBS))])
    assert all(event.wait(60) for event in done)
    return got


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN prepacked linear")
def test_a_model_whose_linears_go_through_onednn_gets_what_the_loop_gives_alone(monkeypatch):
    """The server packs its models' large Linears for oneDNN (gpt.inference.weight_layout.onednn_linears): every
    product here goes through the packed copies (the thresholds lowered for a small model), and each sequence's
    tokens are still those of generate.py's loop alone on the unpacked model."""
    model, tokenizer = model_for(CASES["gpt2"], 4), CharTokenizer(CHARS)
    packed = copy.deepcopy(model)
    monkeypatch.setattr(weight_layout, "MKL_ONE_ROW_THREADS", 0)
    assert weight_layout.onednn_linears(packed, len(JOBS), smallest=0) == 4 * BASE["n_layer"] + 1  # the tied head
    calls = []
    pointwise = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *args: calls.append(1) or pointwise(*args))
    engine = Engine(packed, tokenizer, max_batch=len(JOBS), max_queue=8).start()
    try:
        rows = prompts(7)
        got = serve_together(engine, rows, tokenizer)
        for i, (prompt, (_, n, s)) in enumerate(zip(rows, JOBS)):
            assert got[i] == alone(model, prompt, n, s), i
        assert len(calls) >= engine.steps * (4 * BASE["n_layer"] + 1)  # every product of every call, packed
    finally:
        engine.stop()
    torch.testing.assert_close(packed.state_dict(), model.state_dict(), rtol=0, atol=0)  # the weights untouched
