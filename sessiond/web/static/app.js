// sessiond's web console: the live table, the history, and actions.
// Every action is a POST with the page's CSRF token in X-CSRF-Token.
// Every filter, page and toggle is in the address (the query string), so a view
// can be bookmarked, shared, and restored with Back.
"use strict";

const csrf = () => document.querySelector('meta[name="csrf-token"]').content;

function flash(text, bad) {
  const el = document.getElementById("flash");
  el.textContent = text;
  el.className = bad ? "bad" : "ok";
  el.hidden = false;
}

async function post(url, body) {
  const res = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf()},
    body: JSON.stringify(body || {}),
  });
  const data = await res.json().catch(() => ({ok: false, error: {message: res.statusText}}));
  if (!data.ok) throw new Error(data.error.message);
  return data.result;
}

// --- times: relative words, the exact time on hover (as sessiond.web.humane) ---------

function span(seconds) {
  seconds = Math.abs(seconds);
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 10) return `${Number(seconds.toFixed(1))} s`;
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  let minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  minutes %= 60;
  if (hours < 48) return minutes ? `${hours} h ${minutes} min` : `${hours} h`;
  return `${Math.floor(hours / 24)} d`;
}

function relative(date) {
  const delta = (date.getTime() - Date.now()) / 1000;
  if (Math.abs(delta) < 5) return "just now";
  return delta > 0 ? `in ${span(delta)}` : `${span(delta)} ago`;
}

function exact(date) {
  return date.toISOString().slice(0, 19).replace("T", " ") + " UTC";
}

function timeTag(iso, empty) {
  const date = iso ? new Date(iso) : null;
  if (!date || isNaN(date)) return document.createTextNode(iso || empty || "—");
  const t = document.createElement("time");
  t.className = "rel";
  t.dateTime = iso;
  t.title = exact(date);
  t.textContent = relative(date);
  return t;
}

// A next wake as ps gives it ("2026-12-06T08:00:00Z; on message"): its time relative.
function wakeTag(text) {
  const frag = document.createDocumentFragment();
  if (!text) { frag.append("—"); return frag; }
  const cut = text.indexOf("; ");
  const first = cut < 0 ? text : text.slice(0, cut);
  if (!/^\d{4}-\d\d-\d\dT/.test(first) || isNaN(new Date(first))) { frag.append(text); return frag; }
  frag.append(timeTag(first), cut < 0 ? "" : text.slice(cut));
  return frag;
}

function refreshTimes() {
  for (const t of document.querySelectorAll("time.rel")) {
    const date = new Date(t.dateTime);
    if (!isNaN(date)) t.textContent = relative(date);
  }
}

// --- small DOM helpers ----------------------------------------------------------------

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = String(text);
  return e;
}

function cell(tr, content, cls, label) {
  const td = el("td", cls);
  if (content instanceof Node) td.appendChild(content);
  else td.textContent = content == null ? "" : String(content);
  if (label) td.dataset.label = label;
  tr.appendChild(td);
  return td;
}

function actionButton(name, action) {
  const b = el("button", "act", action);
  b.type = "button";
  b.dataset.action = action;
  b.dataset.post = `/api/s/${encodeURIComponent(name)}/${action}`;
  if (action === "cancel") b.dataset.confirm = `Cancel ${name}? It terminates, with its program.`;
  return b;
}

// The query string of a form's non-empty fields, plus extra ones.
function queryOf(form, extra) {
  const q = new URLSearchParams();
  for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
  for (const [k, v] of Object.entries(extra || {})) {
    if (v) q.set(k, v); else q.delete(k);
  }
  return q;
}

function fill(form, q) {
  for (const field of form.elements) {
    if (!field.name) continue;
    if (field.type === "checkbox") field.checked = q.get(field.name) === field.value;
    else if (field.type !== "hidden") field.value = q.get(field.name) || "";
  }
}

function remember(q, replace) {
  const url = location.pathname + (q.toString() ? "?" + q : "") + location.hash;
  if (url === location.pathname + location.search + location.hash) return;
  (replace ? history.replaceState : history.pushState).call(history, null, "", url);
}

// --- the process table ----------------------------------------------------------------

function liveTable() {
  const form = document.getElementById("filters");
  if (!form) return;
  let page = Number(new URLSearchParams(location.search).get("page")) || 1, source = null;
  const open = () => {
    if (source) source.close();
    const q = queryOf(form, {page: page > 1 ? String(page) : ""});
    source = new EventSource("/api/sessions/stream?" + q);
    source.addEventListener("page", (ev) => render(JSON.parse(ev.data)));
    source.onopen = () => { document.getElementById("live").textContent = "live"; };
    source.onerror = () => { document.getElementById("live").textContent = "reconnecting…"; };
  };
  const go = () => { remember(queryOf(form, {page: page > 1 ? String(page) : ""})); open(); };
  const render = (p) => {
    if (p.page !== page) {  // the page asked for is past the end: say where we are
      page = p.page;
      remember(queryOf(form, {page: page > 1 ? String(page) : ""}), true);
    }
    const body = document.getElementById("rows");
    body.replaceChildren();
    for (const r of p.rows) {
      const tr = document.createElement("tr");
      tr.dataset.name = r.name;
      tr.dataset.state = r.state;
      const a = el("a", "", r.name);
      a.href = "/s/" + encodeURIComponent(r.name);
      cell(tr, a, "name", "name");
      cell(tr, r.state, "state s-" + r.state, "state");
      if (p.clustered) cell(tr, r.node || "", "node", "node");
      cell(tr, r.agent, "", "agent");
      cell(tr, r.runs, "", "runs");
      cell(tr, r.pending_approvals || "", "", "approvals");
      cell(tr, wakeTag(r.next_wake), "", "next wake");
      cell(tr, timeTag(r.last_active), "", "last active");
      cell(tr, r.reason, "reason", "reason");
      const acts = cell(tr, "", "actions", "actions");
      for (const action of r.actions || []) acts.appendChild(actionButton(r.name, action));
      body.appendChild(tr);
    }
    document.getElementById("count").textContent = `${p.total} of ${p.sessions}`;
    const waiting = document.getElementById("pending");
    if (waiting && p.approvals != null) {  // the approvals tab's count, live
      waiting.textContent = String(p.approvals);
      waiting.title = `${p.approvals} waiting for an answer`;
      waiting.classList.toggle("none", !p.approvals);
    }
    document.getElementById("pageinfo").textContent = `page ${p.page} of ${p.pages}`;
    document.getElementById("prev").disabled = p.page <= 1;
    document.getElementById("next").disabled = p.page >= p.pages;
  };
  form.addEventListener("change", () => { page = 1; go(); });
  form.addEventListener("submit", (ev) => { ev.preventDefault(); page = 1; go(); });
  document.getElementById("prev").onclick = () => { page -= 1; go(); };
  document.getElementById("next").onclick = () => { page += 1; go(); };
  window.addEventListener("popstate", () => {
    const q = new URLSearchParams(location.search);
    fill(form, q);
    page = Number(q.get("page")) || 1;
    open();
  });
  open();
}

// --- a session's history: grouped by turn and run ----------------------------------------

// Turns hold runs (and what happened between a turn's runs); runs hold their events.
// A turn starts with the wake that began it (what led to its first run: the gate,
// the tool's intent) and ends with the session leaving `running` after its last run.
function group(rows) {
  const top = [];
  let turn = null, run = null, ended = null;
  for (const r of rows) {
    const d = r.data || {};
    if (ended && r.type === "lifecycle.changed" && d.from === "running") {
      ended.items.push(r);
      ended.last = r;
      ended = null;
      continue;
    }
    ended = null;
    if (r.type === "run.started") {
      const number = d.turn == null ? null : d.turn;
      if (turn && turn.turn !== number) turn = null;
      if (number != null && !turn) {
        turn = {kind: "turn", turn: number, items: [], first: r, last: r};
        // the lead-up: the events since the last wake that are not in a group yet
        let from = top.length;
        while (from > 0 && !top[from - 1].kind && top[from - 1].type !== "wake.requested") from -= 1;
        if (from > 0 && !top[from - 1].kind) from -= 1; else from = top.length;
        turn.items = top.splice(from);
        if (turn.items.length) turn.first = turn.items[0];
        top.push(turn);
      }
      run = {kind: "run", run: d.run, items: [r], first: r, last: r, finished: null};
      (turn ? turn.items : top).push(run);
      if (turn) turn.last = r;
      continue;
    }
    if (run && r.type === "run.finished" && d.run === run.run) {
      run.items.push(r);
      run.last = r;
      run.finished = r;
      if (turn) turn.last = r;
      run = null;
      if (d.ends_turn !== false) { ended = turn; turn = null; }  // the turn is over
      continue;
    }
    if (run) { run.items.push(r); run.last = r; }
    else if (turn) turn.items.push(r);
    else top.push(r);
    if (turn) turn.last = r;
  }
  return top;
}

function seconds(a, b) { return (new Date(b.ts) - new Date(a.ts)) / 1000; }

function eventRow(r) {
  const row = el("div", "ev");
  row.dataset.type = r.type;
  row.dataset.seq = r.seq;
  row.append(el("span", "seq", r.seq), timeTag(r.ts), el("span", "type", r.type),
             el("span", "what", r.text));
  return row;
}

function runBlock(g, compact) {
  const box = el("details", "run");
  box.dataset.key = "run:" + g.run;
  box.open = !compact;
  const f = g.finished ? g.finished.data : null;
  const took = f ? span((f.duration_ms || 0) / 1000) : `running for ${span(seconds(g.first, {ts: new Date().toISOString()}))}`;
  const sum = el("summary");
  sum.append(el("b", "", `run ${g.run}`), " ",
             el("span", "status " + (f ? (f.status === "ok" ? "ok" : "bad") : "live"), f ? f.status : "running"),
             " · ", el("span", "took", took), " · ", timeTag(g.first.ts),
             el("span", "meta", ` · ${g.items.length} events`));
  box.appendChild(sum);
  for (const r of g.items) box.appendChild(eventRow(r));
  return box;
}

function turnBlock(g, compact) {
  const box = el("details", "turn");
  box.dataset.key = "turn:" + g.turn;
  box.open = !compact;
  const runs = g.items.filter((i) => i.kind === "run");
  const last = runs.length ? runs[runs.length - 1].finished : null;
  const status = last ? last.data.status : "running";
  const sum = el("summary");
  sum.append(el("b", "", `turn ${g.turn}`), " ",
             el("span", "status " + (last ? (status === "ok" ? "ok" : "bad") : "live"), status),
             " · ", el("span", "took", span(seconds(g.first, g.last))),
             " · ", timeTag(g.first.ts), el("span", "meta", ` · ${runs.length} run${runs.length === 1 ? "" : "s"}`));
  box.appendChild(sum);
  for (const i of g.items) box.appendChild(i.kind === "run" ? runBlock(i, compact) : eventRow(i));
  return box;
}

function timeline() {
  const form = document.getElementById("timeline-filter");
  if (!form) return;
  const body = document.getElementById("timeline");
  const compact = () => form.elements.compact.checked;
  fill(form, new URLSearchParams(location.search));
  let rows = [];
  const draw = () => {
    // a person's open/closed choices survive the live redraws
    const chosen = new Map([...body.querySelectorAll("details[data-key]")]
      .map((d) => [d.dataset.key, d.open]));
    body.classList.toggle("compact", compact());
    body.replaceChildren();
    for (const g of group(rows)) {
      const node = g.kind === "turn" ? turnBlock(g, compact()) :
                   g.kind === "run" ? runBlock(g, compact()) : eventRow(g);
      body.appendChild(node);
    }
    for (const d of body.querySelectorAll("details[data-key]")) {
      if (chosen.has(d.dataset.key)) d.open = chosen.get(d.dataset.key);
    }
  };
  const load = async () => {
    const q = queryOf(form, {compact: ""});
    const err = document.getElementById("timeline-error");
    const res = await fetch(`/api/s/${encodeURIComponent(form.dataset.session)}/events?${q}`,
                            {credentials: "same-origin"});
    const data = await res.json();
    if (!res.ok) { err.textContent = data.error.message; err.hidden = false; return; }
    err.hidden = true;
    rows = data;
    draw();
    form.dataset.loaded = String(data.length);
  };
  // the address keeps the filter and the toggle, with what else it had (?before=)
  const address = () => {
    const q = new URLSearchParams(location.search);
    for (const k of ["type", "grep", "since", "until", "compact"]) q.delete(k);
    for (const [k, v] of queryOf(form)) q.set(k, v);
    return q;
  };
  form.addEventListener("submit", (ev) => { ev.preventDefault(); remember(address()); load(); });
  form.elements.compact.addEventListener("change", () => {
    remember(address());
    body.replaceChildren();  // the toggle decides again what is open
    draw();
  });
  window.addEventListener("popstate", () => {
    fill(form, new URLSearchParams(location.search));
    body.replaceChildren();
    load();
  });
  load();
  // live: the session's new events reload the history (with its filter), state and buttons
  const live = new EventSource(`/api/s/${encodeURIComponent(form.dataset.session)}/stream`);
  live.addEventListener("changed", (ev) => {
    const d = JSON.parse(ev.data);
    const state = document.getElementById("state");
    state.textContent = d.state;
    state.className = "state s-" + d.state;
    document.getElementById("reason").textContent = d.reason || "—";
    if (d.actions) {
      const acts = document.getElementById("actions");
      acts.replaceChildren(...d.actions.map((a) => actionButton(form.dataset.session, a)));
      if (!d.actions.length) acts.appendChild(el("span", "none", `no action applies while it is ${d.state}`));
    }
    load();
  });
}

// --- buttons ------------------------------------------------------------------------------

function actions() {
  document.addEventListener("click", async (ev) => {
    const b = ev.target.closest("button");
    if (!b) return;
    try {
      if (b.dataset.post) {
        if (b.dataset.confirm && !window.confirm(b.dataset.confirm)) return;
        const r = await post(b.dataset.post, b.dataset.body ? JSON.parse(b.dataset.body) : {});
        flash(`${b.textContent}: ${r.name} is ${r.state}${r.reason ? " (" + r.reason + ")" : ""}`);
        if (b.classList.contains("resolve")) document.getElementById("state").textContent = r.state;
      } else if (b.dataset.answer) {
        const card = b.closest(".approval");
        const note = card.querySelector(".note").value;
        const r = await post(`/api/s/${encodeURIComponent(card.dataset.session)}/${b.dataset.answer}`,
                             {call: card.dataset.call, note: note});
        card.classList.add("answered");
        card.querySelector(".answer").textContent =
          `${b.dataset.answer === "approve" ? "approved" : "denied"}: ${r.name} is ${r.state}`;
      } else if (b.dataset.send) {
        const box = b.closest(".reply");
        const text = box.querySelector(".message");
        const r = await post(b.dataset.send, {text: text.value});
        text.value = "";
        box.querySelector(".sent")?.remove();
        box.appendChild(el("p", "sent ok", `sent to ${r.session} (seq ${r.seq})`));
        flash(`message sent to ${r.session}`);
      }
    } catch (e) {
      flash(e.message, true);
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  refreshTimes();
  setInterval(refreshTimes, 30_000);
  liveTable(); timeline(); actions();
});
