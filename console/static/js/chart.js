// A live time-series chart (uPlot, vendored in /static/vendor/uplot). The container's data-points
// attribute counts the points drawn, so a page (and its tests) can tell an empty chart apart.

const HEIGHT_PX = 220;
const SPAN_MIN_S = 60; // the x axis shows at least the last minute, however few the points

export class TimeChart {
  constructor(container, { label, format }) {
    this.container = container;
    const series = {
      label,
      stroke: "#2563eb",
      width: 2,
      fill: "rgba(37, 99, 235, 0.12)",
      spanGaps: false,
      value: (u, v) => (v === null || v === undefined ? "-" : format(v)),
    };
    this.plot = new uPlot({
      width: this.width(),
      height: HEIGHT_PX,
      series: [{}, series],
      axes: [{}, { label, size: 70 }],
      scales: {
        x: { time: true },
        y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] }, // rates and lag: from zero
      },
    }, [[], []], container);
    container.dataset.points = "0";
    window.addEventListener("resize", () => this.plot.setSize({ width: this.width(), height: HEIGHT_PX }));
  }

  width() {
    return Math.max(320, this.container.clientWidth || 800);
  }

  update(times, values) {
    this.plot.setData([times, values]);
    if (times.length) { // uPlot does not range x over a single point: set it, for every update alike
      const last = times[times.length - 1];
      this.plot.setScale("x", { min: Math.min(times[0], last - SPAN_MIN_S), max: last });
    }
    this.container.dataset.points = String(values.filter((v) => v !== null && v !== undefined).length);
  }
}
