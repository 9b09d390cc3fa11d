"""Shared fixtures: a small text corpus, a way to run the real scripts, and the GPT-2 encoding check."""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import re
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
# The tests sit in folders by the package's roles (tests/model/, tests/weights/, ...) and share helpers across them
# (from test_chat_data import CHARS): every folder is importable, whichever file pytest collects first.
sys.path[1:1] = [str(folder) for folder in sorted((ROOT / "tests").iterdir())
                 if folder.is_dir() and folder.name.isidentifier() and folder.name not in ("fixtures", "golden")]
# A shell starts a background job (`make test &`) with Ctrl-C ignored, and every process a test starts would inherit
# that: the tests that press Ctrl-C need it delivered.
signal.signal(signal.SIGINT, signal.default_int_handler)
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: one thread per worker and per process it starts
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the project's modules to bytecode once, before any test: with PYTHONDONTWRITEBYTECODE set (as on
    this project's machines) every process a test starts would otherwise compile them again from source."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller (or a run without workers) does it for all
        import compileall

        for folder in ("gpt", "scripts", "tests"):  # an unwritable checkout: the processes compile as before
            compileall.compile_dir(ROOT / folder, quiet=2)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Freeze what the tests left before pytest's last checks collect garbage five times over it: a worker that has
    imported torch, transformers and lm_eval took over 5 s there, and pytest-xdist then interrupts it with a SIGINT
    (seen as "Exception ignored in ... gc_callback ... KeyboardInterrupt" at the end of the run)."""
    from gpt.cli import skip_final_collection

    skip_final_collection()


def gpt2_encoding_available() -> bool:
    try:
        from gpt.tokenizers.tokenizer import load_gpt2_encoding

        load_gpt2_encoding()
        return True
    except Exception:
        return False


needs_gpt2 = pytest.mark.skipif(
    not gpt2_encoding_available(),
    reason="the GPT-2 encoding (tiktoken r50k_base) is not reachable: set TIKTOKEN_CACHE_DIR to a cache holding it",
)


def write_corpus(folder: Path) -> Path:
    """Twelve small Python-like text files in a new folder (enough for a tiny model's train and val splits)."""
    folder.mkdir(parents=True)
    for i in range(12):
        body = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(40))
        (folder / f"mod{i:02d}.py").write_text(body)
    return folder


@pytest.fixture(autouse=True)
def designs_environment_restored():
    """GPT_DESIGNS as it was before each test: a design a test loads in this process is added to it (for the
    processes the test starts), and would otherwise reach the scripts later tests start (a design of the same name
    from another file is then refused as already registered)."""
    before = os.environ.get("GPT_DESIGNS")
    yield
    if before is None:
        os.environ.pop("GPT_DESIGNS", None)
    else:
        os.environ["GPT_DESIGNS"] = before


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    """The corpus of write_corpus, fresh for each test."""
    return write_corpus(tmp_path / "corpus")


@pytest.fixture(scope="module")
def data_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Overrides that train on the corpus of write_corpus, prepared once per test module into its own data root."""
    root = tmp_path_factory.mktemp("text")
    corpus = write_corpus(root / "corpus")
    return ["data=text", f"data.path={corpus}", f"data.root={root / 'data'}"]


_in_slow_test = False  # whether the test being set up is marked slow (pytest_runtest_setup keeps it current)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Runs before any fixture of a test, so run_script knows whether the test may start a process."""
    global _in_slow_test
    _in_slow_test = item.get_closest_marker("slow") is not None


def save_char_model(path: Path, chars: str, **sizes: int) -> None:
    """A checkpoint file of a freshly initialised character model over ``chars`` (no training needed)."""
    from gpt import GPT, GPTConfig
    from gpt.tokenizers.tokenizer import CharTokenizer
    from gpt.weights import checkpoint

    config = GPTConfig(**sizes, vocab_size=len(chars))
    checkpoint.save({"model": GPT(config).state_dict(), "model_config": config.to_dict(),
                     "tokenizer": CharTokenizer(list(chars)).to_meta()}, path)


def dotted_global_pickle(module: str, name: str, argument: str) -> bytes:
    """A protocol-4 pickle that calls ``module``'s attribute path ``name`` (e.g. "os.mkdir") with ``argument``:
    the way a crafted .metadata reaches what an allowed module imported."""
    def text(s: str) -> bytes:
        data = s.encode()
        return b"X" + len(data).to_bytes(4, "little") + data  # BINUNICODE
    return b"\x80\x04" + text(module) + text(name) + b"\x93" + text(argument) + b"\x85R."  # STACK_GLOBAL TUPLE1 REDUCE


def run_script(
    name: str, *args: str, cwd: Path | None = None, timeout: int = 300, input: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run scripts/<name>.py with args, as a user would, capturing its output; env adds variables.

    Only from a test marked slow: ``make test-fast`` (-m "not slow") starts no process."""
    if not _in_slow_test:
        raise RuntimeError(f"run_script({name!r}) starts a process: mark the test @pytest.mark.slow")
    # PYTHONPATH: the scripts import this checkout's gpt package, whatever else is installed.
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    full_env.pop("HYDRA_FULL_ERROR", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args],
        cwd=cwd or ROOT,
        env=full_env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


_mains: dict[str, Callable[..., None]] = {}


def run_inline(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """scripts/<name>.py's main() in this process on ``args``, with what run_script would give: the exit code, stdout
    and stderr. For commands a user gets refused: they stop before any work, so a process would spend its seconds
    importing torch. The real processes are run_script's (each script's refusals keep at least one there)."""
    if name not in _mains:
        _mains[name] = runpy.run_path(str(ROOT / "scripts" / f"{name}.py"), run_name=f"inline_{name}")["main"]
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.update(env or {})
    os.environ.pop("HYDRA_FULL_ERROR", None)
    code: int | str | None = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            _mains[name](list(args))
    except SystemExit as stop:
        code = stop.code
    finally:
        os.environ.clear()
        os.environ.update(saved)
    code = 0 if code is None else code if isinstance(code, int) else 1
    return subprocess.CompletedProcess([name, *args], code, out.getvalue(), err.getvalue())


def run_forked(
    name: str, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: int = 300,
) -> subprocess.CompletedProcess:
    """run_inline in a fork of this process, in ``cwd``: the script's work done apart (whatever it registers,
    compiles or changes stays in the fork) without a new interpreter importing torch. For runs whose point is what
    the script writes, not the process it is (its start-up, signals, exit): those are run_script's. One thread in
    the fork, as in every process of ``make test`` (an OpenMP pool does not survive a fork). Where this process has
    already run a backward pass, torch refuses autograd in its forks: the run then gets a real process."""
    if not _in_slow_test:
        raise RuntimeError(f"run_forked({name!r}) starts a process: mark the test @pytest.mark.slow")
    if sys.platform != "linux":  # forking a process that has loaded torch is not safe on macOS: a real process there
        return run_script(name, *args, cwd=cwd, env=env, timeout=timeout)
    import json

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork: never returns into pytest
        payload = [1, "", "the forked run did not finish"]
        try:
            import faulthandler

            import torch

            os.close(read)
            faulthandler.dump_traceback_later(timeout, exit=True)  # a hang: its stacks on stderr, then exit
            torch.set_num_threads(1)
            if not _autograd_works(torch):
                payload = None  # a real process instead (below)
                return
            os.chdir(cwd or ROOT)
            done = run_inline(name, *args, env=env)
            payload = [done.returncode, done.stdout, done.stderr]
        except BaseException:
            import traceback

            payload[2] = traceback.format_exc()
        finally:
            try:
                with open(write, "w") as pipe:
                    pipe.write(json.dumps(payload))
            finally:
                os._exit(0)  # whatever happened: the fork never runs on into pytest
    os.close(write)
    with open(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    if text == "null":  # autograd does not work in a fork of this process: the run gets a real one
        return run_script(name, *args, cwd=cwd, env=env, timeout=timeout)
    code, stdout, stderr = json.loads(text) if text else (
        1, "", f"the forked run ended without a result (killed, or stopped after {timeout} s: its stacks above)")
    return subprocess.CompletedProcess([name, *args], code, stdout, stderr)


def _autograd_works(torch) -> bool:
    """Whether a backward pass runs in this (forked) process: once the parent has run one, torch refuses autograd in
    its forks ("Unable to handle autograd's threading in combination with fork-based multiprocessing")."""
    try:
        torch.ones(1, requires_grad=True).sum().backward()
    except RuntimeError:
        return False
    return True


# A torchrun worker: arms a stack dump of every thread (then exit) for a worker still running after argv[1]
# seconds, executes argv[2] (a fault to inject, or nothing), then runs the script argv[3] as __main__.
TORCHRUN_WORKER = ("import faulthandler, runpy, sys; faulthandler.dump_traceback_later(float(sys.argv[1]), exit=True); "
                   "exec(sys.argv[2]); sys.argv = sys.argv[3:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: Path, *args: str, cwd: Path, fault: str = "", timeout: int = 280) -> subprocess.CompletedProcess:
    """``script`` in 2 gloo processes under torchrun, one thread each, capturing the output.

    A worker that hangs prints every thread's stack and exits after timeout - 60 s, so a failure says where it
    stopped; the launcher is stopped at ``timeout`` with the output's tail in the failure."""
    return _launch([TORCHRUN_WORKER, str(timeout - 60), fault, str(script), *args], cwd, timeout)


# A torchrun worker that runs the script argv[2]'s main() on each command line of the JSON list argv[3] in turn, in
# one process group (gpt.train.distributed joins it once per process), with argv[1]'s stack dump armed.
TORCHRUN_RUNS_WORKER = ("import faulthandler, json, runpy, sys; faulthandler.dump_traceback_later(float(sys.argv[1]), "
                        "exit=True); from gpt.train.distributed import run_worker; "
                        "main = runpy.run_path(sys.argv[2], run_name='torchrun_runs')['main']; "
                        "run_worker(lambda: [main(args) for args in json.loads(sys.argv[3])])")


def torchrun_runs(script: Path, *runs: list[str], cwd: Path, timeout: int = 280) -> subprocess.CompletedProcess:
    """Each of ``runs`` (a command line of ``script``) in turn, in one launch of 2 gloo processes under torchrun
    (as torchrun() runs one): for runs whose point is what they compute, not a start of their own. The first that
    fails ends the launch with its exit status."""
    import json

    return _launch([TORCHRUN_RUNS_WORKER, str(timeout - 60), str(script), json.dumps(runs)], cwd, timeout)


def _launch(worker: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    """torchrun of 2 processes, one thread each, each running ``python -c`` on ``worker``, stopped at ``timeout``."""
    if not _in_slow_test:
        raise RuntimeError("torchrun() starts processes: mark the test @pytest.mark.slow")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
              f"--master_port={free_port()}", "--no-python", sys.executable, "-c", *worker]
    try:
        return subprocess.run(launch, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b"").decode(errors="replace") + (err.stderr or b"").decode(errors="replace")
        pytest.fail(f"torchrun still running after {timeout} s; its output ends:\n{out[-4000:]}")


def failure_output(result: subprocess.CompletedProcess) -> str:
    """What explains a failed torchrun: a hung worker's stack dumps when there are any, else stderr's tail."""
    at = result.stderr.find("Timeout (")
    return result.stderr[at:at + 6000] if at >= 0 else result.stderr[-3000:]


# --- attention designs: what tests/designs/test_designs.py and tests/designs/ share.

def tutorial_design() -> Path:
    """docs/designs.md's design file, written into a temporary folder outside the project and loaded from there
    (once per process: a second talking_heads would be refused as already registered)."""
    from gpt.designs import loading
    from gpt.model import design as registry

    code = re.search(r"^```python file=talking_heads\.py\n(.*?)^```$", (ROOT / "docs" / "designs.md").read_text(),
                     flags=re.S | re.M).group(1)
    folder = Path(tempfile.mkdtemp(prefix="gpt-design-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "talking_heads.py").write_text(code)
    if "talking_heads" not in registry.available():
        loading.load(str(folder / "talking_heads.py"))
    return folder / "talking_heads.py"


def accepted_kernels(config: dict) -> list[str]:
    """Every kernel GPTConfig accepts for ``config`` (none: []); a design that uses no kernel runs once, with sdpa."""
    from gpt import GPTConfig
    from gpt import kernels as attention
    from gpt.errors import ConfigError
    from gpt.model import design as registry

    if not all(d.uses_kernel for d in registry.active(GPTConfig(**{**config, "attention": "manual"}))):
        return ["sdpa"]
    able = []
    for kernel in attention.available():
        try:
            GPTConfig(**{**config, "attention": kernel})
            able.append(kernel)
        except ConfigError:
            pass
    return able


def perturbed_model(config: dict, kernel: str = "sdpa", sharpen: float = 1.0):
    """A seeded random model (eval mode), weights scaled by ``sharpen``, with the parameters that start at ones or
    zeros (norm gains, sink logits, biases, differential lambdas) moved away from them, so a test sees them act."""
    import torch

    from gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**config, "attention": kernel}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(sharpen)
            if name.endswith(("norm.weight", "subln.weight", "attn.sink")):
                p.add_(torch.randn_like(p))
            elif name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.5)
            elif "attn.lambda_" in name:
                p.copy_(torch.randn_like(p) * 0.5)
            elif not name.endswith(".weight"):  # a design's own parameters (a mixing matrix, ...)
                p.add_(torch.randn_like(p) * 0.5)
    return model.eval()


def train_stop_and_resume(overrides: list[str], tmp_path: Path, half: int = 4) -> tuple[dict, dict, dict]:
    """In-process training of scripts/train.py's config with ``overrides``: ``half`` steps, resumed to twice that,
    and as many straight; the model state dicts after ``half``, after the resume and of the straight run (to
    compare bit for bit)."""
    from hydra import compose, initialize_config_dir

    from gpt.schema import register, typed
    from gpt.train.trainer import train
    from gpt.weights import checkpoint

    register()
    common = [*overrides, "device=cpu", "train.warmup_iters=0", f"train.lr_decay_iters={2 * half}",
              f"train.eval_interval={half}", "train.eval_iters=1", "train.batch_size=4", "train.sample_tokens=0"]

    def run(out: Path, steps: int, resume: bool = False) -> dict:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
            cfg = compose(config_name="train", overrides=[*common, f"train.max_iters={steps}", f"out_dir={out}",
                                                          f"resume={str(resume).lower()}"])
        train(typed(cfg), out, log=lambda message: None)
        return checkpoint.load(out / checkpoint.LATEST)["model"]

    first = run(tmp_path / "resumed", half)
    return first, run(tmp_path / "resumed", 2 * half, resume=True), run(tmp_path / "straight", 2 * half)


# --- numbers recorded on one build: bit for bit there, within a stated tolerance elsewhere (test_golden, test_compat).

def environment() -> dict[str, object]:
    """What the bits of numbers computed on a CPU depend on: torch's version and build (a CUDA build's CPU kernels
    are not a CPU-only wheel's), the CPU's vendor and the SIMD level torch uses (ATEN_CPU_CAPABILITY lowers it)."""
    import platform

    import torch

    vendor = ""
    if Path("/proc/cpuinfo").is_file():
        lines = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("vendor_id")]
        vendor = lines[0].split(":", 1)[1].strip() if lines else ""
    return {"torch": torch.__version__, "cuda_build": torch.version.cuda is not None,
            "cpu_vendor": vendor or platform.processor(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine()}


def recorded_here(recorded: dict) -> bool:
    """Whether numbers recorded on ``recorded`` (an environment(), with an optional "note") came from this very
    environment: every part of it recorded and the same (one recorded before all parts were is never this one)."""
    return {k: v for k, v in recorded.items() if k != "note"} == environment()


def check_recorded(what: str, recordings: list[tuple[dict, list[str], list[str]]], tolerance: str) -> None:
    """Numbers against their recordings, each (its environment, what differs at all, what differs beyond the
    tolerance): bit for bit against one recorded here, and done if any recording matches bit for bit; otherwise
    within ``tolerance`` (its words) of every recording, with a warning that says which comparison ran."""
    for recorded, differs, _ in recordings:
        if recorded_here(recorded):
            assert not differs, f"{what}: {differs} differ from what was recorded on this environment ({recorded})"
    exact = [recorded for recorded, differs, _ in recordings if not differs]
    if exact:
        print(f"{what}: bit for bit, as recorded on {({k: v for k, v in exact[0].items() if k != 'note'})}")
        return
    for recorded, _, beyond in recordings:
        assert not beyond, f"{what}: beyond {tolerance} of what was recorded on {recorded}: {beyond}"
    warnings.warn(f"{what}: nothing recorded on {environment()}; compared within {tolerance} instead of bit for bit",
                  UserWarning, stacklevel=2)
