// Building the page from data: elements with text (never HTML from the cluster), tables, formats.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// columns: [{label, value: row => text or Node, num?: true}]; rows without any: the `empty` line.
export function table(id, columns, rows, empty = "none") {
  const head = el("tr", {}, columns.map((c) => el("th", { class: c.num ? "num" : null }, c.label)));
  const body = rows.length
    ? rows.map((row) => el("tr", {}, columns.map((c) => el("td", { class: c.num ? "num" : null }, show(c.value(row))))))
    : [el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, empty))];
  return el("table", { id }, el("thead", {}, head), el("tbody", {}, body));
}

function show(value) {
  return value === null || value === undefined || value === "" ? "-" : value;
}

export function link(href, text) {
  return el("a", { href }, text);
}

export function badge(ok, text) {
  return el("span", { class: `badge ${ok ? "ok" : "bad"}` }, text);
}

export function replace(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

export function count(n) {
  return n === null || n === undefined ? null : Number(n).toLocaleString("en-US");
}

export function rate(perSecond) {
  return perSecond === null || perSecond === undefined ? null : `${perSecond.toFixed(perSecond < 10 ? 1 : 0)}/s`;
}

export function bytes(n) {
  if (n === null || n === undefined) return null;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${units[i]}`;
}

export function seconds(s) {
  if (s === null || s === undefined) return null;
  if (s < 120) return `${Math.round(s)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

// Epoch ms as local "YYYY-MM-DD HH:MM:SS.mmm".
export function time(ms) {
  if (!ms) return null;
  const d = new Date(ms);
  const p = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} `
    + `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}.${p(d.getMilliseconds(), 3)}`;
}

export function errorBox(message) {
  return el("div", { class: "error", role: "alert" }, message);
}
