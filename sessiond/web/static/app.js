// sessiond's web console: the live table, the timeline filter, and actions.
// Every action is a POST with the page's CSRF token in X-CSRF-Token.
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

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text == null ? "" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function liveTable() {
  const form = document.getElementById("filters");
  if (!form) return;
  let page = 1, source = null;
  const open = () => {
    if (source) source.close();
    const q = new URLSearchParams(new FormData(form));
    q.set("page", page);
    source = new EventSource("/api/sessions/stream?" + q);
    source.addEventListener("page", (ev) => render(JSON.parse(ev.data)));
    source.onopen = () => { document.getElementById("live").textContent = "live"; };
    source.onerror = () => { document.getElementById("live").textContent = "reconnecting…"; };
  };
  const render = (p) => {
    page = p.page;
    const body = document.getElementById("rows");
    body.replaceChildren();
    for (const r of p.rows) {
      const tr = document.createElement("tr");
      tr.dataset.name = r.name;
      const a = document.createElement("a");
      a.href = "/s/" + encodeURIComponent(r.name);
      a.textContent = r.name;
      cell(tr, "").appendChild(a);
      cell(tr, r.state, "state s-" + r.state);
      if (p.clustered) cell(tr, r.node || "", "node");
      cell(tr, r.agent);
      cell(tr, r.runs);
      cell(tr, r.pending_approvals || "");
      cell(tr, r.next_wake);
      cell(tr, r.last_active);
      cell(tr, r.reason);
      body.appendChild(tr);
    }
    document.getElementById("count").textContent = `${p.total} of ${p.sessions}`;
    document.getElementById("pageinfo").textContent = `page ${p.page} of ${p.pages}`;
    document.getElementById("prev").disabled = p.page <= 1;
    document.getElementById("next").disabled = p.page >= p.pages;
  };
  form.addEventListener("change", () => { page = 1; open(); });
  form.addEventListener("submit", (ev) => { ev.preventDefault(); page = 1; open(); });
  document.getElementById("prev").onclick = () => { page -= 1; open(); };
  document.getElementById("next").onclick = () => { page += 1; open(); };
  open();
}

function timeline() {
  const form = document.getElementById("timeline-filter");
  if (!form) return;
  const load = async () => {
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
    const err = document.getElementById("timeline-error");
    const res = await fetch(`/api/s/${encodeURIComponent(form.dataset.session)}/events?${q}`,
                            {credentials: "same-origin"});
    const data = await res.json();
    if (!res.ok) { err.textContent = data.error.message; err.hidden = false; return; }
    err.hidden = true;
    const body = document.getElementById("timeline");
    body.replaceChildren();
    for (const r of data) {
      const tr = document.createElement("tr");
      tr.className = "ev";
      tr.dataset.type = r.type;
      cell(tr, r.seq); cell(tr, r.ts); cell(tr, r.type, "type"); cell(tr, r.text);
      body.appendChild(tr);
    }
    form.dataset.loaded = String(data.length);
  };
  form.addEventListener("submit", (ev) => { ev.preventDefault(); load(); });
  load();
  // live: the session's new events reload the timeline (with its filter) and state
  const live = new EventSource(`/api/s/${encodeURIComponent(form.dataset.session)}/stream`);
  live.addEventListener("changed", (ev) => {
    const d = JSON.parse(ev.data);
    const state = document.getElementById("state");
    state.textContent = d.state;
    state.className = "state s-" + d.state;
    document.getElementById("reason").textContent = d.reason || "—";
    load();
  });
}

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
      }
    } catch (e) {
      flash(e.message, true);
    }
  });
}

document.addEventListener("DOMContentLoaded", () => { liveTable(); timeline(); actions(); });
