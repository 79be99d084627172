// The memory calculator's page script: it loads Pyodide and the workshop's own Python modules (served with
// the book), builds the form from what Python says it is, and draws what Python computes. It does no
// arithmetic of its own: every number, verdict and message comes from workshop_lib.book.calculator.page.

const here = new URL(".", import.meta.url);
const root = document.getElementById("calculator");
const form = document.getElementById("form");
const presetSelect = document.getElementById("preset");
let calculator = null;
let options = null;

function fail(message) {
  root.dataset.state = "failed";
  document.getElementById("status").textContent = message;
  tellHeight();
}

async function fetchChecked(name, kind) {
  const response = await fetch(new URL(name, here));
  if (!response.ok) throw new Error(`${name}: HTTP ${response.status}`);
  return kind === "text" ? response.text() : response.arrayBuffer();
}

function element(tag, attributes = {}, text = "") {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text) node.textContent = text;
  return node;
}

function buildForm() {
  for (const field of options.fields) {
    const label = element("label", { "data-field": field.name, "data-engines": field.engines.join(" ") });
    let input;
    if (field.kind === "choice") {
      input = element("select", { name: field.name });
      for (const [value, text] of field.choices) input.append(element("option", { value }, text));
    } else if (field.kind === "integer") {
      input = element("input", { name: field.name, type: "number", step: "1" });
    } else {
      input = element("input", { name: field.name, type: "checkbox" });
      label.classList.add("flag");
    }
    if (field.kind === "flag") label.append(input, element("span", {}, field.label));
    else label.append(element("span", {}, field.label), input);
    form.append(label);
  }
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  form.addEventListener("submit", (event) => event.preventDefault());
}

function setValues(values) {
  for (const field of options.fields) {
    if (!(field.name in values)) continue;
    const input = form.elements[field.name];
    if (field.kind === "flag") input.checked = values[field.name] === true || values[field.name] === "true";
    else input.value = String(values[field.name]);
  }
}

function formValues() {
  const values = {};
  for (const field of options.fields) {
    const input = form.elements[field.name];
    values[field.name] = field.kind === "flag" ? input.checked : input.value;
  }
  return values;
}

function showFieldsOf(engine) {
  for (const label of form.querySelectorAll("label[data-field]")) {
    const engines = label.dataset.engines;
    label.hidden = engines !== "" && !engines.split(" ").includes(engine);
  }
}

function fillList(list, items, build) {
  list.replaceChildren(...items.map(build));
}

function drawBar(bar, parts, markers = []) {
  bar.replaceChildren();
  for (const part of parts) {
    const segment = element("span", { class: "segment", "data-part": part.part,
                                      title: `${part.label}: ${part.gib} GiB` });
    segment.style.width = `${part.share * 100}%`;
    bar.append(segment);
  }
  for (const marker of markers) {
    const line = element("div", { class: "marker", "data-card": marker.card });
    line.style.left = `${marker.share * 100}%`;
    line.append(element("span", {}, `${marker.card} usable`));
    bar.append(line);
  }
}

function drawLegend(list, parts) {
  fillList(list, parts, (part) => {
    const item = element("li", { "data-part-legend": part.part });
    item.append(element("span", { class: "swatch", "data-part": part.part }), `${part.label} ${part.gib} GiB`);
    return item;
  });
}

function render(result) {
  const problems = document.getElementById("problems");
  problems.hidden = result.problems.length === 0;
  problems.querySelector("h3").textContent = result.ok
    ? "workshop validate would refuse this experiment (the estimate is still shown)"
    : "This layout cannot run as set";
  fillList(problems.querySelector("ul"), result.problems, (problem) => {
    const item = element("li", { "data-source": problem.source, "data-severity": problem.severity });
    item.append(element("span", { class: "source" },
                        problem.source + (problem.rule ? ` [${problem.rule}]` : "") + ": "),
                element("span", { class: "message" }, problem.message));
    if (problem.fix) item.append(" ", element("span", { class: "fix" }, `Fix: ${problem.fix}`));
    return item;
  });
  const results = document.getElementById("results");
  results.hidden = !result.ok;
  root.dataset.state = result.ok ? "ready" : "refused";
  if (!result.ok) return;

  document.getElementById("description").textContent = result.description;
  root.querySelector('[data-value="gpu-total"]').textContent = result.gpu.total_gib;
  drawBar(document.getElementById("gpu-bar"), result.gpu.parts, result.gpu.cards);
  drawLegend(document.getElementById("gpu-legend"), result.gpu.parts);
  const rows = result.gpu.parts.map((part) => {
    const row = element("tr", { "data-part-row": part.part });
    row.append(element("td", {}, part.label), element("td", { class: "number" }, part.gib));
    return row;
  });
  const total = element("tr", { class: "total" });
  total.append(element("td", {}, "total (peak)"), element("td", { class: "number", "data-value": "gpu-total-row" },
                                                          result.gpu.total_gib));
  document.querySelector("#breakdown tbody").replaceChildren(...rows, total);
  fillList(document.getElementById("verdicts"), result.fits, (verdict) =>
    element("li", { "data-card": verdict.card, "data-fits": String(verdict.fits) },
            `${verdict.card} (${verdict.memory_gib} GiB): ${verdict.text}`));

  const host = result.host;
  document.getElementById("host-text").textContent = host.text;
  document.getElementById("host-text").dataset.value = host.per_node_gib;
  drawBar(document.getElementById("host-bar"), host.parts);
  document.getElementById("host-bar").hidden = host.parts.length === 0;
  drawLegend(document.getElementById("host-legend"), host.parts);

  renderReference(result.reference);
  document.getElementById("command-row").hidden = !result.command;
  document.getElementById("command").textContent = result.command || "";
  document.getElementById("formula").textContent = result.formula;
  document.getElementById("parameters").textContent = result.parameters;
  fillList(document.getElementById("assumptions"), result.assumptions, (text) => element("li", {}, text));
}

function renderReference(reference) {
  const box = document.getElementById("reference");
  box.replaceChildren();
  box.dataset.exact = String(Boolean(reference.exact));
  if (!reference.found) {
    box.append(element("p", {}, reference.text));
    return;
  }
  const head = element("p");
  head.append(element("span", { class: `badge ${reference.exact ? "exact" : "closest"}` },
                      reference.exact ? "measured: this configuration" : "closest measured run"),
              " ", element("code", { "data-value": "reference-id" }, reference.id),
              ` — ${reference.title}; ran with ${reference.ran_with} on ${reference.gpu} (${reference.source})`);
  box.append(head);
  if (reference.differences.length) {
    const list = element("ul", { class: "differences" });
    for (const text of reference.differences) list.append(element("li", {}, text));
    box.append(element("p", {}, "It differs from your layout in:"), list);
  }
  const table = element("table", { class: "measured" });
  for (const row of reference.measured) {
    const line = element("tr", { "data-measured": row.what });
    line.append(element("td", {}, row.label), element("td", { class: "number" }, `${row.gib} GiB`));
    table.append(line);
  }
  if (reference.predicted_for_run) {
    const line = element("tr", { "data-measured": "predicted-for-run" });
    const error = reference.predicted_for_run.error ? ` (${reference.predicted_for_run.error})` : "";
    line.append(element("td", {}, "the estimator for that run as it ran"),
                element("td", { class: "number" }, `${reference.predicted_for_run.gib} GiB${error}`));
    table.append(line);
  }
  box.append(table);
  if (reference.engine_error) box.append(element("p", { class: "engine-error" }, reference.engine_error));
  if (reference.also.length) box.append(element("p", {}, `Same configuration also measured: ${reference.also.join("; ")}`));
  if (!reference.exact) {
    const button = element("button", { type: "button", id: "load-reference" }, "Load this run's configuration");
    button.addEventListener("click", () => { setValues(reference.inputs); update(); });
    box.append(button);
  }
}

function update() {
  const values = formValues();
  showFieldsOf(values.engine);
  render(JSON.parse(calculator.calculate_json(JSON.stringify(values))));
  shareLink(values);
  tellHeight();
}

// ?chapter=N: that chapter's runs, opened on ?experiment=ID (else its first run); no chapter: every chapter's
// runs, grouped, and the form opens on the defaults.
function applyPresets(query) {
  const chapter = options.chapters[query.get("chapter") || ""];
  const chapters = chapter ? [chapter] : Object.values(options.chapters);
  const runs = chapters.flatMap((each) => each.experiments);
  const option = (run) => element("option", { value: run.id }, `${run.id} — ${run.title}`);
  if (chapter) {
    document.getElementById("preset-title").textContent = chapter.title;
    presetSelect.replaceChildren(...chapter.experiments.map(option));
  } else {
    document.getElementById("preset-title").textContent = "Start from a run of the workshop";
    presetSelect.replaceChildren(element("option", { value: "" }, "(your own layout)"), ...chapters.map((each) => {
      const group = element("optgroup", { label: each.title });
      group.append(...each.experiments.map(option));
      return group;
    }));
  }
  document.getElementById("presets").hidden = false;
  presetSelect.addEventListener("change", () => {
    const run = runs.find((candidate) => candidate.id === presetSelect.value);
    if (run) { setValues(run.inputs); update(); }
  });
  const wanted = runs.find((run) => run.id === query.get("experiment")) || (chapter ? runs[0] : null);
  presetSelect.value = wanted ? wanted.id : "";
  return wanted ? wanted.inputs : null;
}

// The page's height to the page that embeds it (the book's embed.js sizes the iframe to fit).
function tellHeight() {
  if (window.parent !== window) {
    window.parent.postMessage({ memoryCalculatorHeight: Math.ceil(root.getBoundingClientRect().bottom + window.scrollY) }, "*");
  }
}

function shareLink(values) {
  const link = document.getElementById("share");
  link.href = `${location.pathname}?${new URLSearchParams(values)}`;
}

// Imported when needed, so that a book built without Pyodide says so instead of "Loading…" forever.
async function importPyodide() {
  try {
    return (await import("./pyodide/pyodide.mjs")).loadPyodide;
  } catch (error) {
    throw new Error("this build of the book has no Pyodide (pyodide/pyodide.mjs is missing): run `npm ci` "
                    + "in the workshop's folder (`make setup` does) and build the book again");
  }
}

async function start() {
  const loadPyodide = await importPyodide();
  const [pyodide, modules, data] = await Promise.all([
    loadPyodide({ indexURL: new URL("pyodide/", here).href }),
    fetchChecked("workshop_lib.zip", "binary"),
    fetchChecked("calculator-data.json", "text"),
  ]);
  pyodide.unpackArchive(modules, "zip");
  const Calculator = pyodide.pyimport("workshop_lib.book.calculator.page").Calculator;
  calculator = Calculator(data);
  options = JSON.parse(calculator.options_json());
  buildForm();
  const defaults = Object.fromEntries(options.fields.map((field) => [field.name, field.default]));
  const query = new URLSearchParams(location.search);
  const preset = applyPresets(query);
  const fromQuery = Object.fromEntries(options.fields.filter((f) => query.has(f.name)).map((f) => [f.name, query.get(f.name)]));
  setValues({ ...defaults, ...(preset || {}), ...fromQuery });
  document.getElementById("status").hidden = true;
  form.hidden = false;
  update();
}

for (const details of document.querySelectorAll("details")) details.addEventListener("toggle", tellHeight);
window.addEventListener("resize", tellHeight);
start().catch((error) => fail(`The calculator could not start: ${error.message || error}`)).finally(tellHeight);
