// The book's chart runtime (bundled with Vega, Vega-Lite and Vega-Embed into
// _static/coupling/charts.js by coupling_utils.pipeline.book_extension; loaded only by pages
// that have charts, never from another host).
//
// Every element of class "coupling-chart" holds an empty ".coupling-chart-view", the Vega-Lite
// spec in a <script type="application/json" class="coupling-chart-spec"> and a static picture.
// When a chart comes near the viewport its live view is drawn; once it is drawn the element
// gets the class "is-live" (the stylesheet then hides the static picture on screen; print keeps
// it) and data-state="live"; a chart that cannot be drawn gets data-state="error" and a console
// error (the book's browser test fails on both).

const couplingViews = [];

function couplingEmbed(chart) {
  if (chart.couplingPromise) return chart.couplingPromise;
  const script = chart.querySelector("script.coupling-chart-spec");
  const target = chart.querySelector(".coupling-chart-view");
  if (!script || !target) {
    chart.dataset.state = "error";
    console.error("coupling chart: no spec or view element in", chart);
    return (chart.couplingPromise = Promise.resolve(null));
  }
  chart.dataset.state = "loading";
  let spec;
  try {
    spec = JSON.parse(script.textContent);
  } catch (err) {
    chart.dataset.state = "error";
    console.error("coupling chart: unreadable spec", err);
    return (chart.couplingPromise = Promise.resolve(null));
  }
  const options = {
    mode: "vega-lite",
    renderer: script.dataset.renderer === "svg" ? "svg" : "canvas",
    actions: { export: true, source: false, compiled: false, editor: false },
    tooltip: { theme: "light" },
    downloadFileName: chart.id || "chart",
  };
  chart.couplingPromise = vegaEmbed(target, spec, options)
    .then((result) => {
      chart.vegaView = result.view;
      couplingViews.push(result.view);
      chart.classList.add("is-live");
      chart.dataset.state = "live";
      return result.view;
    })
    .catch((err) => {
      chart.dataset.state = "error";
      console.error("coupling chart: could not draw the live view", err);
      return null;
    });
  return chart.couplingPromise;
}

function couplingCharts() {
  return Array.from(document.querySelectorAll(".coupling-chart"));
}

function couplingStart() {
  const charts = couplingCharts();
  if (!("IntersectionObserver" in window)) {
    charts.forEach(couplingEmbed);
    return;
  }
  const observer = new IntersectionObserver(
    (entries) => {
      for (const entry of entries) {
        if (entry.isIntersecting) {
          observer.unobserve(entry.target);
          couplingEmbed(entry.target);
        }
      }
    },
    { rootMargin: "600px 0px" },
  );
  charts.forEach((chart) => observer.observe(chart));
}

window.couplingCharts = {
  views: couplingViews,
  embed: couplingEmbed,
  embedAll: () => Promise.all(couplingCharts().map(couplingEmbed)),
};

if (document.readyState === "loading") {
  document.addEventListener("DOMContentLoaded", couplingStart);
} else {
  couplingStart();
}
