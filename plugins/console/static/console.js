// Live charts: polls /api/live every 2 s and draws the last 60 points as SVG polylines.
"use strict";
(function () {
  const charts = Array.from(document.querySelectorAll(".chart[data-live]"));
  if (!charts.length) return;
  const history = [];
  const NS = "http://www.w3.org/2000/svg";

  function series(point, chart) {
    if (chart.dataset.live === "lag") {
      const lag = point.lag[chart.dataset.group];
      return lag === undefined ? {} : { lag: lag };
    }
    const out = {};
    for (const [name, b] of Object.entries(point.brokers)) {
      out[name + " put"] = b.put_tps;
      out[name + " get"] = b.get_tps;
    }
    return out;
  }

  function draw(chart) {
    const points = history.map((p) => series(p, chart));
    const names = Array.from(new Set(points.flatMap((p) => Object.keys(p))));
    const max = Math.max(1, ...points.flatMap((p) => Object.values(p)));
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", "0 0 600 150");
    svg.setAttribute("preserveAspectRatio", "none");
    const colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
    names.forEach((name, i) => {
      const line = document.createElementNS(NS, "polyline");
      const coords = points.map((p, x) => `${(x * 600) / 59},${140 - ((p[name] || 0) * 130) / max}`);
      line.setAttribute("points", coords.join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", colors[i % colors.length]);
      line.setAttribute("stroke-width", "2");
      svg.appendChild(line);
      const label = document.createElementNS(NS, "text");
      label.setAttribute("x", 6);
      label.setAttribute("y", 14 + i * 14);
      label.setAttribute("font-size", "11");
      label.setAttribute("fill", colors[i % colors.length]);
      const last = points.length ? points[points.length - 1][name] || 0 : 0;
      label.textContent = `${name}: ${Math.round(last * 10) / 10}`;
      svg.appendChild(label);
    });
    chart.replaceChildren(svg);
    const lagText = document.getElementById("group-lag");
    const latest = points.length ? points[points.length - 1].lag : undefined;
    if (chart.dataset.live === "lag" && lagText && latest !== undefined) {
      lagText.textContent = latest;
    }
  }

  async function poll() {
    try {
      const group = charts.map((c) => c.dataset.group).find((g) => g);
      const url = group ? "/api/live?group=" + encodeURIComponent(group) : "/api/live";
      const resp = await fetch(url, { credentials: "same-origin" });
      if (resp.ok && resp.headers.get("content-type").startsWith("application/json")) {
        history.push(await resp.json());
        if (history.length > 60) history.shift();
        charts.forEach(draw);
      }
    } catch (e) {
      // the console server is restarting: try again on the next tick
    }
  }
  poll();
  setInterval(poll, 2000);
})();
