// The dashboard's live parts: each page polls /ui/api/… (the session cookie) and redraws.
// Plain DOM, no library: the coordinator's machines are offline and the page must ship whole.
"use strict";
const XCLP = (() => {
  const POLL_MS = 1000;

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    for (const c of children) if (c != null) e.append(c);
    return e;
  }

  async function getJSON(url) {
    const r = await fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}});
    if (r.status === 401) { window.location = "/ui/login"; throw new Error("logged out"); }
    if (!r.ok) throw new Error(`${url}: ${r.status}`);
    return r.json();
  }

  function poll(fn) {
    const tick = async () => {
      try { await fn(); document.body.dataset.updated = String(Date.now()); }
      catch (err) { console.warn(err); }
      if (!document.body.dataset.stopped) setTimeout(tick, POLL_MS);
    };
    tick();
  }

  const bytes = (n) => n >= 1 << 20 ? `${(n / (1 << 20)).toFixed(1)} MiB` : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`;
  const pct = (v) => v == null ? "–" : `${(100 * v).toFixed(1)} %`;
  const when = (iso) => iso ? new Date(iso).toLocaleString() : "never";

  // a job's sites, each revoked one marked (`xclp site revoke`) with when, in its title
  const siteList = (j) => j.sites.flatMap((s, i) => {
    const parts = i ? [", ", s] : [s], at = (j.revoked || {})[s];
    if (at) parts.push(" ", el("span", {class: "badge", "data-status": "revoked", "data-site": s,
                                        title: `revoked at ${when(at)}`, text: "revoked"}));
    return parts;
  });

  // the list's filters (service.job_list): kept in the page's address, so that a link or a reload keeps them
  function jobFilters() {
    const form = document.getElementById("job-filters");
    const url = new URL(window.location);
    for (const name of ["kind", "status"]) form.elements[name].value = url.searchParams.get(name) || "";
    form.elements.unfold.checked = url.searchParams.get("unfold") === "1";
    const query = () => {
      const q = new URLSearchParams();
      for (const name of ["kind", "status"]) if (form.elements[name].value) q.set(name, form.elements[name].value);
      if (form.elements.unfold.checked) q.set("unfold", "1");
      return q;
    };
    form.addEventListener("change", () => {
      const q = query().toString();
      window.history.replaceState(null, "", q ? `?${q}` : window.location.pathname);
      document.body.dataset.filtered = q;  // (the next poll redraws with them; a test waits for it)
    });
    return query;
  }

  // a training job's rounds, folded under it: how many, and how they ended
  const rounds = (j) => j.round_jobs ? ` · ${j.round_jobs} round job${j.round_jobs > 1 ? "s" : ""}` +
    ` (${Object.entries(j.round_jobs_by_status).map(([s, n]) => `${n} ${s}`).join(", ")})` : "";

  function jobsPage() {
    const query = jobFilters();
    poll(async () => {
      const q = query().toString();
      const [{jobs}, {sites}] = await Promise.all([getJSON(`/ui/api/jobs${q ? "?" + q : ""}`), getJSON("/ui/api/sites")]);
      const body = document.getElementById("jobs");
      body.dataset.query = q;
      body.replaceChildren(...(jobs.length ? jobs.map((j) => el("tr", {"data-job": j.job, "data-parent": j.parent || ""},
        el("td", {}, el("a", {href: `/ui/jobs/${j.job}`, text: j.job})),
        el("td", {"data-round-jobs": String(j.round_jobs || 0),
                  text: (j.kind === "train" ? `train (${j.algorithm})` : j.parent ? "predict (a round's)" : "predict") + rounds(j)}),
        el("td", {}, el("span", {class: "badge", "data-status": j.status, text: j.status})),
        el("td", {text: j.phase}), el("td", {text: j.kind === "train" ? String(j.round) : ""}),
        el("td", {}, ...siteList(j)), el("td", {text: j.crypto || ""}), el("td", {text: when(j.created_at)})))
        : [el("tr", {}, el("td", {colspan: "8", class: "muted", text: q ? "no job matches these filters" : "no jobs yet"}))]));
      document.getElementById("sites").replaceChildren(...sites.map((s) => el("tr", {"data-site": s.site,
                                                                                  "data-revoked": s.revoked_at ? "1" : "0"},
        el("td", {}, el("a", {href: `/ui/sites/${s.site}`, text: s.site})),
        el("td", {}, s.revoked_at ? el("span", {class: "badge", "data-status": "revoked",
                                                text: `revoked ${when(s.revoked_at)}`}) : "active"),
        el("td", {text: when(s.last_contact)}),
        el("td", {text: String(s.jobs)}), el("td", {text: String(s.running)}))));
    });
  }

  function timeline(job) {
    // a Gantt row per phase: each bar starts where the phases before it ended (seconds to scale)
    const secs = job.timeline.map((p) => p.seconds || 0);
    const total = secs.reduce((a, b) => a + b, 0) || 1;
    let start = 0;
    return job.timeline.map((p, i) => {
      const left = 100 * start / total, width = Math.max(0.8, 100 * secs[i] / total);
      start += secs[i];
      return el("div", {class: `phase ${p.state}`, "data-phase": p.phase, "data-state": p.state},
      el("span", {class: "name", text: p.phase}),
      el("div", {class: "track"}, el("div", {class: "bar", style: `margin-left:${Math.min(left, 99.2)}%;width:${width}%`})),
      el("span", {class: "facts", text: `${p.seconds == null ? (p.state === "running" ? "running" : "–") : p.seconds.toFixed(2) + " s"} · ${bytes(p.bytes)}`}),
      p.dropped.length ? el("span", {class: "dropped", text: `dropped here: ${p.dropped.join(", ")}`}) : null);
    });
  }

  function curves(history) {
    // accuracies on [0, 1] as lines, one column per round (inline SVG); sites left out are a count,
    // not an accuracy: they go in the rounds table (roundsTable), never on this axis
    const W = 640, H = 220, L = 40, B = 24, n = history.length;
    const x = (i) => L + (n > 1 ? i * (W - L - 10) / (n - 1) : (W - L) / 2);
    const y = (v) => H - B - v * (H - B - 10);
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("class", "curves");
    const add = (tag, attrs, text) => {
      const e = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
      if (text != null) e.textContent = text;
      svg.append(e);
      return e;
    };
    for (const v of [0, 0.5, 1]) {
      add("line", {x1: L, x2: W - 10, y1: y(v), y2: y(v), class: "grid"});
      add("text", {x: 4, y: y(v) + 4, class: "axis"}, `${v * 100}%`);
    }
    history.forEach((r, i) => add("text", {x: x(i) - 4, y: H - 6, class: "axis"}, String(r.round)));
    // what the sites' accuracy is measured on (xclp.training.strategy.SCORED_ON), from the rounds themselves
    const scoredOn = (history.find((r) => r.local_accuracy_of) || {}).local_accuracy_of || "accuracy on the sites' own points";
    const series = [["local_accuracy", scoredOn], ["pseudo_label_accuracy", "pseudo-label accuracy"],
                    ["xclp_pseudo_label_accuracy", "XCLP pseudo-label accuracy"]];
    const legend = [];
    series.forEach(([key, label], k) => {
      const pts = history.map((r, i) => r[key] == null ? null : `${x(i)},${y(r[key])}`).filter(Boolean);
      if (!pts.length) return;
      add("polyline", {points: pts.join(" "), class: `s${k}`, "data-series": key});
      legend.push(el("span", {class: `key s${k}`, text: `${label}: ${pct(history[history.length - 1][key])}`}));
    });
    return [svg, el("p", {class: "legend"}, ...legend)];
  }

  function roundsTable(history) {
    // one row a round: who was left out (names and count) beside the round's accuracies
    return history.map((r) => el("tr", {"data-round": String(r.round)},
      el("td", {text: String(r.round)}),
      el("td", {class: r.left_out ? "error" : "muted", "data-left-out": String(r.left_out),
                text: r.left_out ? `${r.left_out_sites.join(", ")} (${r.left_out})` : "none"}),
      el("td", {text: pct(r.local_accuracy)}), el("td", {text: pct(r.pseudo_label_accuracy ?? r.xclp_pseudo_label_accuracy)})));
  }

  function jobPage(id) {
    poll(async () => {
      const job = await getJSON(`/ui/api/jobs/${id}`);
      const status = document.getElementById("status");
      status.textContent = job.status;
      status.dataset.status = job.status;
      document.getElementById("phase").textContent = job.phase;
      document.getElementById("bytes").textContent = bytes(job.bytes_total);
      document.getElementById("round-info").textContent = job.kind === "train" ?
        `round ${job.progress.round} of ${job.progress.rounds}` : (job.attempt ? `attempt ${job.attempt}` : "");
      // the whole job's share done (ui_api.progress_bar): a failed job keeps what it completed, in red
      const bar = document.getElementById("progress-bar");
      bar.style.width = `${(100 * job.bar.fraction).toFixed(1)}%`;
      bar.dataset.state = job.bar.state;
      document.getElementById("progress-text").textContent = job.status === "running" ?
        `${job.progress.received} of ${job.progress.expected} parts of this phase received` :
        job.status === "failed" || job.status === "cancelled" ? `stopped in phase ${job.phase}` : "";
      // who the phase waits for, and when it gives up on them (service.liveness)
      const secs = (v) => v == null ? "never since the coordinator started" : v < 120 ? `${Math.round(v)} s ago` :
        `${Math.floor(v / 60)} min ago`;
      document.getElementById("awaited").replaceChildren(...Object.entries(job.awaited || {}).map(
        ([site, a]) => el("li", {"data-site": site, text: `awaiting ${site}: last contact ${secs(a.last_contact_s)}` +
          (a.idle_left_s == null ? "" : `; dropped if silent ${Math.round(a.idle_left_s)} s more`)})));
      document.getElementById("deadline").textContent = job.deadline ?
        `phase ${job.deadline.phase}${job.deadline.job ? ` of round ${job.round}'s XCLP job ${job.deadline.job}` : ""} ` +
        `gives up on the sites it awaits at ${job.deadline.at} (in ` +
        `${Math.max(0, Math.round(job.deadline.left_s))} s); a site silent ${job.deadline.idle_limit_s} s is dropped sooner` : "";
      document.getElementById("failure").textContent = job.failure || "";
      const cancelForm = document.getElementById("cancel-form");  // (the operator's page only)
      if (cancelForm) cancelForm.hidden = job.status !== "running";
      document.getElementById("job-sites").replaceChildren(...siteList(job));
      document.getElementById("refused").replaceChildren(...Object.entries(job.refused || {}).map(
        ([site, why]) => el("li", {text: `${site} refused: ${why}`})));
      document.getElementById("timeline").replaceChildren(...timeline(job));
      const training = document.getElementById("training");
      training.hidden = job.kind !== "train";
      if (job.kind === "train") {
        document.getElementById("curves").replaceChildren(
          ...(job.history.length ? curves(job.history) : [el("p", {class: "muted", text: "no round has closed yet"})]));
        document.getElementById("rounds").replaceChildren(...roundsTable(job.history));
      }
      const privacy = document.getElementById("privacy");
      privacy.hidden = !job.privacy;
      if (job.privacy) {
        document.getElementById("epsilon").textContent =
          `ε = ${job.privacy.epsilon.toPrecision(4)} at δ = ${job.privacy.delta} spent so far` +
          (job.privacy.budget ? ` of a budget of ${job.privacy.budget}` : "") + ` (${job.privacy.neighbouring}); ` +
          `${job.privacy.events.length} release(s) in the ledger`;
      }
      if (job.status !== "running") document.body.dataset.stopped = "1";  // a finished job changes no more
    });
  }

  return {jobsPage, jobPage};
})();
