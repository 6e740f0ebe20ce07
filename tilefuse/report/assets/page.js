// tilefuse HTML report: lays out the plan's graph with Viz.js (inlined above) and wires the
// kernel panel, the sortable table and the roofline points to one selection.
(() => {
  "use strict";
  const data = JSON.parse(document.getElementById("tf-data").textContent);
  const K = data.kernels;
  const graphBox = document.getElementById("graph");
  const panel = document.getElementById("panel");
  const table = document.getElementById("kernels");
  let svg = null, natural = [0, 0], scale = 1, current = null;

  const el = (tag, props, ...kids) => {
    const e = document.createElement(tag);
    Object.assign(e, props || {});
    for (const k of kids) e.append(k);
    return e;
  };
  const fmt = (v) => (v === null || v === undefined) ? "—" : Number(v).toLocaleString("en-US", {maximumFractionDigits: 3});

  // Graph element ids: cluster "k<i>", prim node "k<i>-<prim>", collapsed kernel "k<i>-all".
  function kernelOf(target) {
    const g = target.closest("g.cluster, g.node");
    const m = g && /^k(\d+)(-|$)/.exec(g.id);
    return m ? Number(m[1]) : null;
  }

  function badge(text, cls) { return el("span", {className: "badge " + cls, textContent: text}); }

  // The kernel's binaries (CompiledModel.native(): compiled for the target, read by cuobjdump)
  // beside the cost model's registers, shared memory and occupancy.
  function nativeTable(rows) {
    if (!rows || !rows.length) return [];
    const head = ["kernel", "tensor cores", "registers binary / model", "spills B", "shared KiB binary / model",
                  "programs/SM binary / model", "16-byte loads", "pipelined"];
    const t = el("table", {}, el("tr", {}, ...head.map(h => el("th", {textContent: h}))));
    for (const r of rows) {
      const cells = [r.kernel, r.mma, r.registers + " / " + r.model_registers, String(r.spill_bytes),
                     (r.shared_bytes / 1024).toFixed(1) + " / " + (r.model_shared_bytes / 1024).toFixed(1),
                     r.occupancy + " / " + r.model_occupancy, Math.round(100 * r.wide_load_share) + "%",
                     r.tma_loads ? "TMA" : r.pipelined ? "cp.async" : "no"];
      t.append(el("tr", {}, ...cells.map(v => el("td", {textContent: v}))));
    }
    return [el("h3", {textContent: "Compiled for sm_" + rows[0].arch + " (from the binary)"}), t];
  }

  function fillPanel(k) {
    const d = K[k];
    const measured = d.measured_us !== null;
    const rows = [
      ["time", [fmt(d.time_us) + " µs ", badge(measured ? "measured" : "modelled", measured ? "measured" : "modelled")]],
      ["measured", measured ? fmt(d.measured_us) + " µs (CUDA events)" : "not measured"],
      ["DRAM bytes", fmt(d.bytes) + " (modelled)"],
      ["L2 bytes", fmt(d.l2_bytes) + " (modelled, re-reads included)"],
      ["flops", fmt(d.flops)],
      ["intensity", d.intensity === null ? "—" : fmt(d.intensity) + " flops/B"],
      ["attained", d.attained || "—"],
      ["bound", d.bound + " (the modelled term that dominates)"],
      ["grid", fmt(d.grid) + " programs × " + d.warps + " warps"],
      ["waves", d.waves + " (occupancy " + d.occupancy + " programs/SM)"],
      ["schedule", el("code", {textContent: d.schedule || "—"})],
    ];
    const dl = el("dl");
    for (const [t, v] of rows) dl.append(el("dt", {textContent: t}), el("dd", {}, ...[].concat(v)));
    const ops = el("ul");
    for (const [op, node, loc] of d.ops) ops.append(el("li", {}, el("b", {textContent: op}), " '" + node + "'" + (loc ? " at " + loc : "")));
    const prims = el("table", {}, el("tr", {}, ...["prim", "operator", "node", "category", "type"].map(h => el("th", {textContent: h}))));
    for (const p of d.prims) prims.append(el("tr", {}, ...p.map(v => el("td", {textContent: v}))));
    const lang = d.language === "triton" ? "Generated Triton source" : d.language ? "Library / torch call" : "Source";
    panel.replaceChildren(
      el("h2", {textContent: "#" + d.index + " " + d.name}),
      el("p", {}, badge(d.family, "family"), " kernel, " + d.prims.length + " prim" + (d.prims.length === 1 ? "" : "s")),
      dl,
      ...nativeTable(d.native),
      el("h3", {textContent: "Source operators"}), ops,
      el("h3", {textContent: "Prims"}), prims,
      el("h3", {textContent: "Reads / writes"}),
      el("p", {}, el("code", {textContent: d.inputs.join(", ") + "  →  " + d.outputs.join(", ")})),
      el("h3", {textContent: lang}),
      el("pre", {className: "source", textContent: d.source || "(not built)"}));
    panel.scrollTop = 0;
  }

  function select(k, reveal) {
    if (k === null || !K[k]) return;
    current = k;
    for (const e of document.querySelectorAll(".sel")) e.classList.remove("sel");
    for (const e of document.querySelectorAll('#kernels tr[data-k="' + k + '"], #roofline .pt[data-k="' + k + '"]')) e.classList.add("sel");
    fillPanel(k);
    if (!svg) return;
    const cluster = svg.getElementById ? svg.getElementById("k" + k) : svg.querySelector("#k" + k);
    if (!cluster) return;
    cluster.classList.add("sel");
    if (reveal) {
      document.getElementById("plan").scrollIntoView();
      const b = cluster.getBoundingClientRect(), box = graphBox.getBoundingClientRect();
      graphBox.scrollLeft += b.left - box.left - 20;
      graphBox.scrollTop += b.top - box.top - 20;
    }
  }

  function zoom(s) {
    scale = Math.max(0.05, Math.min(4, s));
    svg.style.width = (natural[0] * scale) + "pt";
    svg.style.height = (natural[1] * scale) + "pt";
  }
  // Fit the width (1pt = 4/3 px); tall graphs scroll vertically.
  const fitWidth = () => zoom(Math.min(1, (graphBox.clientWidth - 8) / (natural[0] * 4 / 3)));

  function draw(dot) {
    document.body.dataset.graph = "rendering";
    return Viz.instance().then((viz) => {
      svg = viz.renderSVGElement(dot);
      natural = [svg.width.baseVal.valueInSpecifiedUnits, svg.height.baseVal.valueInSpecifiedUnits];
      for (const g of svg.querySelectorAll("g.cluster")) {       // tooltips: kernel names, not DOT ids
        const m = /^k(\d+)$/.exec(g.id), t = g.querySelector("title");
        if (m && t) t.textContent = "#" + m[1] + " " + K[Number(m[1])].name + " (click for details)";
      }
      graphBox.replaceChildren(svg);
      fitWidth();
      if (current !== null) select(current, false);
      document.body.dataset.graph = "ready";
    }).catch((err) => {
      document.body.dataset.graph = "error";
      graphBox.replaceChildren(el("p", {className: "loading", textContent: "The graph could not be laid out: " + err}));
      console.error(err);
    });
  }

  graphBox.addEventListener("click", (ev) => {
    const k = kernelOf(ev.target);
    if (k !== null) select(k, false);
  });
  document.getElementById("zoom-in").addEventListener("click", () => svg && zoom(scale * 1.25));
  document.getElementById("zoom-out").addEventListener("click", () => svg && zoom(scale / 1.25));
  document.getElementById("zoom-fit").addEventListener("click", () => svg && fitWidth());
  const showAll = document.getElementById("show-all");
  showAll.addEventListener("click", () => {
    if (!data.dot_full) return;
    showAll.disabled = true;
    document.body.dataset.graph = "rendering";     // from now on, not the old graph's "ready"
    graphBox.replaceChildren(el("p", {className: "loading", textContent: "Laying out every prim…"}));
    setTimeout(() => draw(data.dot_full), 0);      // let the message paint first
  });

  // The kernel table: sort by a column (numbers by value, text alphabetically; ties in plan order).
  const tbody = table.tBodies[0];
  for (const th of table.tHead.rows[0].cells) {
    th.addEventListener("click", () => {
      const col = Number(th.dataset.col), numeric = th.dataset.sort === "num";
      const dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
      for (const h of table.tHead.rows[0].cells) h.removeAttribute("aria-sort");
      th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
      const rows = Array.from(tbody.rows);
      rows.sort((a, b) => {
        const x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
        const c = numeric ? Number(x) - Number(y) : x.localeCompare(y);
        return dir * (c || Number(a.dataset.k) - Number(b.dataset.k));
      });
      tbody.append(...rows);
    });
  }
  tbody.addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr[data-k]");
    if (tr) select(Number(tr.dataset.k), true);
  });
  for (const pt of document.querySelectorAll("#roofline .pt")) {
    pt.addEventListener("click", () => select(Number(pt.dataset.k), true));
  }

  draw(data.dot).then(() => {
    const m = /^#k(\d+)$/.exec(location.hash);
    if (m) select(Number(m[1]), true);
  });
})();
