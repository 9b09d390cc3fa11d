// The attention page: generate from one or two models side by side (the server's /v1/completions, streamed), then
// click a token to fetch its attention over its context (/api/attention) and draw every layer and head.
"use strict";

const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const LABEL_W = 58, HEAD_H = 16, ROW_H = 24, GAP = 3;
const ROLE_MIN = 0.3;  // a head is labelled with its best role when that role's score reaches this
const ROLE_NAMES = {previous_token: "previous token", duplicate_token: "duplicate token", induction: "induction"};

function roleLabel(roles, l, h) {  // the head's best role and score, "induction 0.82", or "" below ROLE_MIN
  if (!roles) return "";
  let best = "", top = ROLE_MIN;
  for (const [role, scores] of Object.entries(roles)) {
    if (scores[l][h] >= top) { best = role; top = scores[l][h]; }
  }
  return best ? `${ROLE_NAMES[best] || best} ${top.toFixed(2)}` : "";
}

function colour(x) {  // x in [-1, 1]: viridis for 0..1, blue for negative weights
  if (x < 0) return `rgba(40, 90, 220, ${Math.min(1, -x)})`;
  const t = Math.min(1, x) * (VIRIDIS.length - 1), i = Math.min(Math.floor(t), VIRIDIS.length - 2), f = t - i;
  const c = VIRIDIS[i].map((v, k) => Math.round(v + f * (VIRIDIS[i + 1][k] - v)));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

function headers() {
  const h = {"Content-Type": "application/json"};
  const key = localStorage.getItem("apiKey");
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function api(path, body, signal) {
  const response = await fetch(path, {method: body ? "POST" : "GET", headers: headers(), signal,
                                      body: body ? JSON.stringify(body) : undefined});
  if (response.status === 401) document.getElementById("key_label").hidden = false;
  if (!response.ok) {
    const data = await response.json().catch(() => ({}));
    throw new Error(data.error ? data.error.message : `${response.status} ${response.statusText}`);
  }
  return response;
}

function* events(text) {  // complete server-sent events in text; the rest is left for the next read
  let at;
  while ((at = text.buffer.indexOf("\n\n")) >= 0) {
    const event = text.buffer.slice(0, at);
    text.buffer = text.buffer.slice(at + 2);
    if (event.startsWith("data: ")) yield event.slice(6);
  }
}

class Pane {
  constructor(el) {
    this.el = el;
    this.select = el.querySelector(".model");
    this.status = el.querySelector(".status");
    this.about = el.querySelector(".about");
    this.tokens = el.querySelector(".tokens");
    this.panel = el.querySelector(".attention");
    this.canvas = el.querySelector("canvas.grid");
    this.canvas.addEventListener("click", (e) => this.pickHead(e));
    this.select.addEventListener("change", () => this.describe());
    this.reset();
  }

  reset() {
    this.ids = []; this.spans = []; this.promptTokens = 0; this.picture = null; this.head = null;
    this.tokens.textContent = ""; this.panel.hidden = true; this.canvas.dataset.cells = "0";
  }

  get model() { return this.select.value; }

  describe() {
    const m = window.models.find((x) => x.id === this.model);
    this.el.classList.toggle("off", !m);
    if (!m) { this.about.textContent = "(no second model)"; return; }
    const opts = Object.entries(m.options).map(([k, v]) => `${k}=${v}`).join(", ");
    this.about.textContent = `${m.n_layer} layers x ${m.n_head} heads, ${m.n_embd} wide, context ${m.block_size}, ` +
      `${(m.parameters / 1e6).toFixed(2)}M parameters` + (opts ? `; ${opts}` : "; GPT-2's attention") +
      (m.designs.length ? ` (designs: ${m.designs.join(", ")})` : "");
  }

  addTokens(ids, texts, prompt) {
    ids.forEach((id, k) => {
      const span = document.createElement("span");
      const position = this.ids.length;
      span.className = "tok" + (prompt ? " prompt" : "");
      span.dataset.position = position;
      span.textContent = texts[k] === "\n" ? "\u21b5\n" : texts[k];
      span.title = `token ${id} at position ${position}`;
      span.addEventListener("click", () => this.show(position));
      this.tokens.appendChild(span);
      this.spans.push(span);
      this.ids.push(id);
      if (prompt) this.promptTokens += 1;
    });
  }

  async generate(settings, signal) {
    this.reset();
    if (!this.model) return;
    this.status.textContent = "generating...";
    const body = {model: this.model, prompt: settings.prompt, max_tokens: settings.max_tokens, stream: true,
                  temperature: settings.temperature, return_token_ids: true};
    if (settings.top_k) body.top_k = settings.top_k;
    if (settings.seed !== null) body.seed = settings.seed;
    try {
      const response = await api("/v1/completions", body, signal);
      const reader = response.body.getReader(), decoder = new TextDecoder(), text = {buffer: ""};
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        text.buffer += decoder.decode(value, {stream: true});
        for (const data of events(text)) {
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          const choice = chunk.choices[0];
          if (!choice) continue;
          if (choice.prompt_token_ids) this.addTokens(choice.prompt_token_ids, choice.prompt_token_texts, true);
          else if (choice.token_ids.length) this.addTokens(choice.token_ids, choice.token_texts, false);
          if (choice.finish_reason) this.status.textContent = `${this.ids.length - this.promptTokens} tokens ` +
            `(${choice.finish_reason}); click a token`;
        }
      }
    } catch (err) {
      this.status.textContent = err.name === "AbortError" ? "stopped; click a token" : "";
      if (err.name !== "AbortError") this.fail(err);
    }
  }

  fail(err) {
    this.status.innerHTML = "";
    const span = document.createElement("span");
    span.className = "error";
    span.textContent = err.message;
    this.status.appendChild(span);
  }

  async show(position) {
    try {
      const lens = document.getElementById("lens").checked;  // opt-in: the server computes it only when asked
      const response = await api("/api/attention", {model: this.model, ids: this.ids, position,
                                                     prompt_tokens: this.promptTokens, ...(lens && {lens})});
      this.picture = await response.json();
    } catch (err) { this.fail(err); return; }
    const p = this.picture;
    if (!this.head || this.head[0] >= p.layers) this.head = [p.layers - 1, 0];
    this.spans.forEach((s, i) => {
      s.classList.toggle("selected", i === position);
      s.classList.toggle("outside", i < p.context_start || i > position);
    });
    this.panel.hidden = false;
    this.draw();
    this.drawLens();
  }

  drawLens() {  // a table: a row per stage (the embeddings, then after each block), a column per context position
    const p = this.picture, box = this.panel.querySelector(".lens");
    box.hidden = !p.lens; box.textContent = "";
    if (!p.lens) return;
    const caption = document.createElement("div");
    caption.className = "caption";
    caption.textContent = "Logit lens: the token each stage's stream would predict next at each position (read " +
      "through the final norm and the head), shaded by its probability; the last row is the model's prediction.";
    const table = document.createElement("table"), head = table.insertRow();
    head.appendChild(document.createElement("th"));
    p.tokens.forEach((t, k) => { const th = document.createElement("th"); th.textContent = t;
      th.title = `position ${p.context_start + k}`; head.appendChild(th); });
    for (const stage of p.lens) {
      const row = table.insertRow(), name = document.createElement("th");
      name.textContent = stage.stage; row.appendChild(name);
      stage.tokens.forEach((t, k) => {
        const cell = row.insertCell();
        cell.textContent = t;
        cell.title = `${stage.stage}, after "${p.tokens[k]}": ${t} (p ${stage.probs[k].toFixed(2)})`;
        cell.style.background = `rgba(253, 200, 37, ${stage.probs[k]})`;
      });
    }
    table.dataset.stages = String(p.lens.length);
    box.append(caption, table);
  }

  draw() {
    const p = this.picture, canvas = this.canvas, ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 600, height = HEAD_H + p.layers * (ROW_H + GAP);
    canvas.width = width * ratio; canvas.height = height * ratio; canvas.style.height = height + "px";
    const g = canvas.getContext("2d");
    g.scale(ratio, ratio);
    g.clearRect(0, 0, width, height);
    g.font = "11px system-ui, sans-serif"; g.fillStyle = "#444";
    const cellW = (width - LABEL_W) / p.heads, labels = [];
    for (let h = 0; h < p.heads; h++) g.fillText(`head ${h}`, LABEL_W + h * cellW + 2, 11);
    for (let l = 0; l < p.layers; l++) {
      const y = HEAD_H + l * (ROW_H + GAP);
      g.fillStyle = "#444"; g.fillText(`layer ${l}`, 2, y + ROW_H / 2 + 4);
      for (let h = 0; h < p.heads; h++) {
        const w = p.weights[l][h], top = Math.max(...w.map(Math.abs)) || 1, x0 = LABEL_W + h * cellW;
        const step = (cellW - GAP) / w.length;
        w.forEach((v, t) => { g.fillStyle = colour(v / top); g.fillRect(x0 + t * step, y, Math.ceil(step), ROW_H); });
        const label = roleLabel(p.roles, l, h);
        if (label) {
          g.fillStyle = "rgba(255, 255, 255, 0.85)"; g.fillRect(x0 + 2, y + 2, g.measureText(label).width + 4, 13);
          g.fillStyle = "#222"; g.fillText(label, x0 + 4, y + 12);
          labels.push(`L${l}H${h} ${label}`);
        }
        if (this.head[0] === l && this.head[1] === h) {
          g.strokeStyle = "#d33"; g.lineWidth = 2; g.strokeRect(x0 + 1, y + 1, cellW - GAP - 2, ROW_H - 2);
        }
      }
    }
    canvas.dataset.cells = String(p.layers * p.heads);
    canvas.dataset.roles = labels.join("; ");
    const [l, h] = this.head, token = p.tokens[p.tokens.length - 1];
    this.panel.querySelector(".caption").textContent = `"${token}" (position ${p.position}) over its context, ` +
      `positions ${p.context_start}..${p.position}: each strip is one head's weights, left to right, scaled to ` +
      `its own largest. Text coloured by layer ${l}, head ${h} (click a strip for another).` + (p.roles ?
      ` A label names a head's role where its score on repeated random tokens reaches ${ROLE_MIN}.` : "");
    this.panel.querySelector(".notes").textContent = [...p.views, ...p.notes].join("; ");
    this.colourText();
  }

  colourText() {
    const p = this.picture, w = p.weights[this.head[0]][this.head[1]], top = Math.max(...w.map(Math.abs)) || 1;
    this.spans.forEach((s) => { s.style.background = ""; s.style.color = ""; });
    w.forEach((v, k) => {
      const span = this.spans[p.context_start + k], x = v / top;
      span.style.background = x < 0 ? colour(x) : `rgba(253, 200, 37, ${Math.max(0, x)})`;
    });
  }

  pickHead(event) {
    if (!this.picture) return;
    const box = this.canvas.getBoundingClientRect(), x = event.clientX - box.left, y = event.clientY - box.top;
    const l = Math.floor((y - HEAD_H) / (ROW_H + GAP)), h = Math.floor((x - LABEL_W) / ((box.width - LABEL_W) /
      this.picture.heads));
    if (l < 0 || l >= this.picture.layers || h < 0 || h >= this.picture.heads) return;
    this.head = [l, h];
    this.draw();
  }
}

const panes = [0, 1].map((i) => {
  const el = document.getElementById("pane").content.firstElementChild.cloneNode(true);
  el.dataset.pane = i;
  document.getElementById("panes").appendChild(el);
  return new Pane(el);
});
let running = null;

async function loadModels() {
  try {
    window.models = (await (await api("/api/models")).json()).models;
  } catch (err) { panes[0].fail(err); return; }
  panes.forEach((pane, i) => {
    pane.select.innerHTML = "";
    if (i > 0) pane.select.add(new Option("(none)", ""));
    window.models.forEach((m) => pane.select.add(new Option(m.id, m.id)));
    pane.select.value = window.models[Math.min(i, window.models.length - 1)].id;
    if (i > 0 && window.models.length < 2) pane.select.value = "";
    pane.describe();
  });
}

function number(id, parse) {
  const raw = document.getElementById(id).value.trim();
  return raw === "" ? null : parse(raw);
}

document.getElementById("controls").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (running) running.abort();
  running = new AbortController();
  const settings = {prompt: document.getElementById("prompt").value, max_tokens: number("max_tokens", parseInt),
                    temperature: number("temperature", parseFloat) ?? 1, top_k: number("top_k", parseInt),
                    seed: number("seed", parseInt)};
  document.getElementById("stop").disabled = false;
  await Promise.all(panes.map((pane) => pane.generate(settings, running.signal)));
  document.getElementById("stop").disabled = true;
});
document.getElementById("stop").addEventListener("click", () => running && running.abort());
document.getElementById("api_key").addEventListener("change", (event) => {
  localStorage.setItem("apiKey", event.target.value);
  loadModels();
});
loadModels();
