"""The attention page in headless Chromium (Debian's chromium and chromium-driver, driven by selenium): a prompt
typed, tokens streaming in from two models side by side, a token clicked, every layer's and head's map drawn;
checked in the page and in a screenshot."""

import io
import json
import shutil
import tempfile

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install -e '.[serve]')")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")

from test_serve import DESIGNS, post, save  # noqa: E402

from gpt.inference.chat_template import Renderer  # noqa: E402
from gpt.serve.app import create_app  # noqa: E402
from gpt.serve.config import ServeConfig  # noqa: E402
from gpt.serve.server import load_models, running  # noqa: E402

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,900"]


@pytest.fixture
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("Chromium is missing: apt-get install chromium chromium-driver (Debian's packages)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)  # the system's driver: nothing downloaded
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_page_streams_tokens_and_draws_a_tokens_attention(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    paths = [save(tmp_path / "small.pt", DESIGNS["small"], 0), save(tmp_path / "stream.pt", DESIGNS["stream"], 1)]
    cfg = ServeConfig(ckpt=str(paths[0]), extra_ckpts=[str(paths[1])])
    renderer = Renderer()
    models = load_models(cfg, renderer)
    roles = {role: [[0.0] * DESIGNS["small"]["n_head"] for _ in range(DESIGNS["small"]["n_layer"])]
             for role in ("previous_token", "duplicate_token", "induction")}
    roles["previous_token"][0][1], roles["induction"][1][2], roles["duplicate_token"][1][2] = 0.91, 0.57, 0.4
    roles["induction"][0][0] = 0.29  # under the page's 0.3: no label
    next(iter(models.values())).head_roles = roles  # the small model's, as if the detector had found them
    with running(create_app(models, None, cfg.max_body_bytes, renderer)) as url:
        browser.get(url + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".pane[data-pane='1'] option")) == 3)
        prompt = browser.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys("def f(x):")
        browser.find_element(By.ID, "generate").click()
        pane = {i: f".pane[data-pane='{i}']" for i in (0, 1)}
        status = lambda b, i: b.find_element(By.CSS_SELECTOR, pane[i] + " .status").text  # noqa: E731
        for i in (0, 1):  # 60 tokens after a 9-token prompt, in both panes
            wait.until(lambda b, i=i: "60 tokens (length)" in status(b, i))
            assert len(browser.find_elements(By.CSS_SELECTOR, pane[i] + " .tok")) == 69
        assert browser.find_element(By.CSS_SELECTOR, pane[1] + " .about").text.endswith(
            "window=8, stream.sinks=2 (designs: rope, stream)")
        browser.find_element(By.ID, "lens").click()  # the logit lens too, under each map
        for i, position in ((0, 20), (1, 50)):
            browser.find_elements(By.CSS_SELECTOR, pane[i] + " .tok")[position].click()
            canvas = pane[i] + " canvas.grid"
            shape = DESIGNS["small" if i == 0 else "stream"]
            wait.until(lambda b, c=canvas: b.find_element(By.CSS_SELECTOR, c).get_attribute("data-cells") != "0")
            cells = browser.find_element(By.CSS_SELECTOR, canvas).get_attribute("data-cells")
            assert cells == str(shape["n_layer"] * shape["n_head"])
            rows = browser.execute_script(  # the table as text: a row per stage under a row of the context's tokens
                "return [...document.querySelectorAll(arguments[0])].map(r => [...r.cells].map(c => c.textContent))",
                pane[i] + " .lens tr")
            ids, prompt = browser.execute_script(f"return [panes[{i}].ids, panes[{i}].promptTokens]")
            status, answer = post(url + "/api/attention", json.dumps({
                "model": str(paths[i]), "ids": ids, "prompt_tokens": prompt, "position": position,
                "lens": True}).encode())
            assert status == 200 and rows[0] == ["", *answer["tokens"]]
            assert rows[1:] == [[stage["stage"], *stage["tokens"]] for stage in answer["lens"]]
            assert len(rows) == shape["n_layer"] + 2 and rows[-1][0] == f"block {shape['n_layer'] - 1}"
        labels = browser.find_element(By.CSS_SELECTOR, pane[0] + " canvas.grid").get_attribute("data-roles")
        assert labels == "L0H1 previous token 0.91; L1H2 induction 0.57", labels  # each head's best role
        # the stream model's view: token 50's context began where the last slide left it (block_size 40: at 41
        # tokens, keeping the last 20), and it attends only to the window's 8 tokens and the context's 2 sink tokens
        caption = browser.find_element(By.CSS_SELECTOR, pane[1] + " .caption").text
        assert "positions 21..50" in caption, caption
        lit = browser.execute_script(
            "return [...document.querySelectorAll(arguments[0])].filter(s => s.style.background && "
            "!s.style.background.endsWith(', 0)')).map(s => +s.dataset.position)", pane[1] + " .tok")
        assert lit == [21, 22, *range(43, 51)], lit
        rect = browser.find_element(By.CSS_SELECTOR, pane[0] + " canvas.grid").rect
        png = browser.get_screenshot_as_png()
        scale = browser.execute_script("return window.devicePixelRatio")
    from PIL import Image

    (tmp_path / "page.png").write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    x, y, w, h = (round(rect[k] * scale) for k in ("x", "y", "width", "height"))
    painted = sum(n for n, colour in image.crop((x, y, x + w, y + h)).getcolors(w * h) if colour != (255, 255, 255))
    assert painted > 0.6 * w * h, "the screenshot shows no attention map where the page drew it"
